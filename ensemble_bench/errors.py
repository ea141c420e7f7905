"""Expected faults: one clear line, a meaningful exit code, no traceback (see cli.main).

Exit codes: 0 done; 1 a regression (``ensbench regress``) or an environment fault; 2 a user error;
70 a bug in ensbench (the traceback is printed); 130 interrupted.
"""


class UserError(Exception):
    """A mistake in the user's input (recipe, model name, data); printed as one line."""

    exit_code = 2


class EnvironmentFault(Exception):
    """The machine or stored state, not the input: disk full, read-only or missing folder, no network,
    no such device, a damaged file of an earlier run. One line saying what to do; exit code 1."""

    exit_code = 1


NETWORK_CLASSES = {"ConnectionError", "ConnectTimeout", "ReadTimeout", "Timeout", "gaierror", "OfflineModeIsEnabled",
                   "LocalEntryNotFoundError"}
DISK_FULL = "disk full{where}: free space on that disk (or set output: to another disk) and run the same command again"
NOT_WRITABLE = "cannot write{where}: {why}: make the folder writable or set output: to a writable folder"
DAMAGED_CACHE = ("a response cache database of the run is damaged ({why}): remove the run's cache/<row>_rank0.db "
                 "(its answers are recomputed) and run the same command again")


def _causes(err: BaseException) -> list[BaseException]:
    """``err`` and the exceptions it was raised from or while handling (at most ten)."""
    chain = [err]
    while len(chain) < 10 and (nxt := chain[-1].__cause__ or chain[-1].__context__) is not None and nxt not in chain:
        chain.append(nxt)
    return chain


def _fault_of(err: BaseException) -> EnvironmentFault | None:
    import errno
    import sqlite3

    where = f" ({err.filename})" if isinstance(err, OSError) and err.filename else ""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT) or "database or disk is full" in text:
        return EnvironmentFault(DISK_FULL.format(where=where))
    if isinstance(err, OSError) and err.errno in (errno.EROFS, errno.EACCES, errno.EPERM) or "readonly database" in text:
        return EnvironmentFault(NOT_WRITABLE.format(where=where, why=getattr(err, "strerror", None) or text))
    if isinstance(err, sqlite3.DatabaseError):
        return EnvironmentFault(DAMAGED_CACHE.format(why=text))
    if NETWORK_CLASSES & {cls.__name__ for cls in type(err).__mro__}:
        return EnvironmentFault(f"network unavailable ({text}): check the connection, or use data: offline "
                                "and local or packaged models")
    if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
        return EnvironmentFault("out of memory: lower batch_size, or use fewer, smaller or quantized members")
    return None


def environment_fault(err: BaseException) -> EnvironmentFault | None:
    """The expected environment fault (disk full, read-only folder, damaged cache, no network, out of
    memory) behind an exception a library raised, or None: then it is a bug."""
    return next((fault for cause in _causes(err) if (fault := _fault_of(cause)) is not None), None)
