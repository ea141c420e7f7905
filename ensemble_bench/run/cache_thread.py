"""sqlitedict's worker thread (lm-eval's response cache) when a write fails for the machine.

sqlitedict keeps the exception of a failed statement and raises it again at the next call in the
main thread; but a failed *commit* (the folder turned read-only mid-run, a full disk) ends its
thread with an exception it does not keep: Python prints "Exception in thread Thread-2" and a
traceback, and the next caller waiting for an answer (a blocking commit) waits for good.
``quiet_cache_thread`` installs a ``threading.excepthook`` that keeps such an exception where
sqlitedict raises it again and answers the cache's requests from then on with it, so that the main
thread ends in the one line of an environment fault.
"""

from __future__ import annotations

import threading
from types import TracebackType

from ensemble_bench.errors import environment_fault


def _waiting_queue(traceback: TracebackType | None):
    """The response queue (a weak reference) of the request the worker thread was answering when it
    failed: the ``res_ref`` of sqlitedict's ``run`` loop, or None."""
    while traceback is not None:
        frame = traceback.tb_frame
        if frame.f_code.co_name == "run" and frame.f_globals.get("__name__") == "sqlitedict":
            return frame.f_locals.get("res_ref")
        traceback = traceback.tb_next
    return None


def _keep_and_wake(args) -> None:
    """Keep the thread's exception for the main thread and release a caller waiting for its answer; then
    go on answering every later request of that cache the same way (until it is closed), so that no
    caller waits for a thread that no longer reads its requests."""
    import sqlitedict

    thread, fault = args.thread, (args.exc_type, args.exc_value, args.exc_traceback)
    put, no_more = getattr(sqlitedict, "_put", None), getattr(sqlitedict, "_RESPONSE_NO_MORE", None)
    close = getattr(sqlitedict, "_REQUEST_CLOSE", None)
    thread.exception = fault
    if put is None or no_more is None:  # another sqlitedict: keeping the exception is all that can be done
        return
    put(_waiting_queue(args.exc_traceback), no_more)
    while True:
        request, _, answer_to, _ = thread.reqs.get()
        if request != close:
            with thread._lock:
                thread.exception = fault
        put(answer_to, no_more)
        if request == close:
            return


def cache_thread_hook(previous):
    """A ``threading.excepthook``: an environment fault of sqlitedict's worker thread is kept and raised
    in the main thread (``_keep_and_wake``); any other exception of any thread goes to ``previous``."""
    def hook(args) -> None:
        from sqlitedict import SqliteMultithread

        if isinstance(args.thread, SqliteMultithread) and isinstance(args.exc_value, Exception) and \
                environment_fault(args.exc_value) is not None:
            _keep_and_wake(args)
            return
        previous(args)

    hook.quiets_cache_thread = True
    return hook


def quiet_cache_thread() -> None:
    """Install ``cache_thread_hook`` once (a second call keeps the first)."""
    if not getattr(threading.excepthook, "quiets_cache_thread", False):
        threading.excepthook = cache_thread_hook(threading.excepthook)
