"""The lm-eval adapter registers one model per method, each an explicit class of lm.py."""

import ensemble_bench.lm as lm
from ensemble_bench.methods import METHODS


def test_every_method_has_its_lm_class():
    assert list(lm.LM_CLASSES) == list(METHODS)
    for name, cls in lm.LM_CLASSES.items():
        assert cls.method_name == name and getattr(lm, cls.__name__) is cls


def test_registered_names_resolve_to_the_classes():
    from lm_eval.api.registry import get_model

    lm.register_all()
    for name, cls in lm.LM_CLASSES.items():
        assert get_model(name) is cls
