"""The lm-eval adapter registers one model per method, each a class of lm.py made when its method is
registered."""

import ensemble_bench.run.lm as lm
from ensemble_bench.methods import METHODS, register_method
from ensemble_bench.methods.single import Single


def test_every_method_has_its_lm_class():
    assert list(lm.LM_CLASSES) == list(METHODS)
    for name, cls in lm.LM_CLASSES.items():
        assert cls.method_name == name and getattr(lm, cls.__name__) is cls


def test_registered_names_resolve_to_the_classes():
    from lm_eval.api.registry import get_model

    lm.register_all()
    for name, cls in lm.LM_CLASSES.items():
        assert get_model(name) is cls


def test_a_method_registered_after_import_gets_its_class_at_once():
    late = type("Late", (Single,), {"name": "late_example"})
    assert "late_example" not in lm.LM_CLASSES
    register_method(late)
    try:
        made = lm.LM_CLASSES["late_example"]
        assert made.__name__ == "LateExampleLM" and made.method_name == "late_example" and lm.LateExampleLM is made
    finally:
        METHODS.pop("late_example")
        lm.LM_CLASSES.pop("late_example")
