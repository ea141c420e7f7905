""""Did you mean" for an unknown field of a recipe: the field names a recipe may write at that place
(its pydantic model's fields and their other names), closest first."""

from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import AliasChoices, BaseModel


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (``list[TaskSpec] | None`` -> TaskSpec), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def field_names(model: type[BaseModel]) -> list[str]:
    """Every name a mapping of ``model`` may use for its fields: the field names, their serialization
    names and the choices of their validation aliases (``shots`` and ``num_fewshot``)."""
    names: list[str] = list(_keyed(model))
    for key, field in model.model_fields.items():
        names.append(field.serialization_alias or key)
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names += [choice for choice in alias.choices if isinstance(choice, str)]
        elif isinstance(alias, str):
            names.append(alias)
    return list(dict.fromkeys(names))


def _keyed(model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """The keys a mapping of ``model`` may give beside its fields, and their models (a member's backend
    section: ``MemberSpec.keyed_sections``)."""
    keyed = getattr(model, "keyed_sections", None)
    return keyed() if keyed is not None else {}


def _model_at(model: type[BaseModel], path: list) -> type[BaseModel] | None:
    """The model of the mapping at ``path`` (field names and list indices) below ``model``."""
    for part in path:
        if isinstance(part, int):
            continue
        fields = {field.serialization_alias or key: field for key, field in model.model_fields.items()}
        field = fields.get(part) or model.model_fields.get(part)
        found = _model_in(field.annotation) if field is not None else _keyed(model).get(part)
        if found is None:
            return None
        model = found
    return model


def close_fields(model: type[BaseModel] | None, loc: list) -> list[str]:
    """The known field names closest to the unknown one at the end of ``loc`` (none when nothing is close)."""
    if model is None or not loc or not isinstance(loc[-1], str):
        return []
    holder = _model_at(model, list(loc[:-1]))
    if holder is None:
        return []
    return difflib.get_close_matches(loc[-1], field_names(holder), n=3, cutoff=0.6)
