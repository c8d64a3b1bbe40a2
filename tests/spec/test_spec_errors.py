"""pydantic errors become `file:line:col: dotted.path: message` lines (reliability.md §7.B S12)."""

from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from zoo_core.errors import SpecError
from zoo_core.spec.errors import format_validation_error, spec_error
from zoo_core.spec.yaml_loader import Positions, load_yaml

STRICT = ConfigDict(extra="forbid", strict=True)


class S4DParams(BaseModel):
    model_config = STRICT
    kind: Literal["s4d"] = "s4d"
    d_state: int = 64
    dt_min: float = 0.001

    @field_validator("dt_min")
    @classmethod
    def positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("dt_min must be > 0")
        return v


class MambaParams(BaseModel):
    model_config = STRICT
    kind: Literal["mamba"]
    d_conv: int = 4


class Layer(BaseModel):
    model_config = STRICT
    dropout: float = 0.0


class Model(BaseModel):
    model_config = STRICT
    d_model: int
    core: S4DParams
    mixer: Optional[Annotated[Union[S4DParams, MambaParams], Field(discriminator="kind")]] = None
    either: Union[S4DParams, MambaParams, None] = None
    layers: list[Layer] = []
    named: dict[str, Layer] = {}
    width: Union[int, str] = 0


class Spec(BaseModel):
    model_config = STRICT
    version: int = Field(alias="schema_version")
    model: Model


def validate(text: str, model: type[BaseModel] = Spec, **kwargs) -> tuple[SpecError, str]:
    data, positions = load_yaml(text, "spec.yaml")
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return format_validation_error(info.value, positions, model=model, **kwargs), text


def assert_points_at_key(err: SpecError, text: str) -> None:
    """Every reported line of the file holds the last key of the reported path (S12)."""
    lines = text.splitlines()
    for loc, line, col, _ in err.errors:
        key = str(loc[-1])
        assert lines[line - 1][col - 1 :].startswith(key), (loc, line, col, lines[line - 1])


GOOD = """\
schema_version: 1
model:
  core:
    d_state: 16
  d_model: 64
"""


def test_typo_gets_exact_line_path_and_suggestion():
    err, text = validate(GOOD.replace("d_state", "d_stat"))
    assert str(err) == "spec.yaml:4:5: model.core.d_stat: unknown key 'd_stat'; did you mean 'd_state'?"
    assert err.errors == [(("model", "core", "d_stat"), 4, 5, "unknown key 'd_stat'; did you mean 'd_state'?")]
    assert_points_at_key(err, text)
    assert isinstance(err, ValueError)


def test_unknown_key_without_close_match_lists_allowed_keys():
    err, _ = validate(GOOD + "  _target_: os.system\n")
    assert str(err) == ("spec.yaml:6:3: model._target_: unknown key '_target_' (allowed: core, d_model, "
                        "either, layers, mixer, named, width)")


def test_alias_is_a_candidate_and_top_level_typo():
    err, _ = validate(GOOD.replace("schema_version", "schema_versoin"))
    lines = str(err).splitlines()
    # the model accepts only the alias, so only the alias is suggested
    assert "spec.yaml:1:1: schema_versoin: unknown key 'schema_versoin'; did you mean 'schema_version'?" in lines
    assert "spec.yaml:1:1: schema_version: missing required key" in lines


def test_without_model_there_is_no_suggestion():
    data, positions = load_yaml(GOOD.replace("d_state", "d_stat"), "spec.yaml")
    with pytest.raises(ValidationError) as info:
        Spec.model_validate(data)
    plain = format_validation_error(info.value, positions)
    assert str(plain) == "spec.yaml:4:5: model.core.d_stat: unknown key 'd_stat'"


def test_wrong_type_names_path_and_line():
    err, text = validate(GOOD.replace("d_state: 16", "d_state: '16'"))
    assert str(err) == "spec.yaml:4:5: model.core.d_state: Input should be a valid integer (got '16')"
    assert_points_at_key(err, text)


def test_validator_message_kept_without_url():
    err, text = validate(GOOD.replace("d_state: 16", "dt_min: -1.0"))
    assert str(err) == "spec.yaml:4:5: model.core.dt_min: Value error, dt_min must be > 0 (got -1.0)"
    assert "pydantic.dev" not in str(err) and "further information" not in str(err)


def test_missing_key_points_at_the_parent():
    err, _ = validate(GOOD.replace("  d_model: 64\n", ""))
    assert str(err) == "spec.yaml:2:1: model.d_model: missing required key"


def test_one_line_per_error_first_error_first():
    err, text = validate(GOOD.replace("d_state: 16", "d_stat: 16\n    dt_min: 'x'").replace("64", "6.5"))
    lines = str(err).splitlines()
    assert len(lines) == len(err.errors) == 3
    assert lines[0].startswith("spec.yaml:6:3: model.d_model: Input should be a valid integer")  # field order
    assert lines[1].startswith("spec.yaml:5:5: model.core.dt_min: Input should be a valid number")
    assert lines[2].startswith("spec.yaml:4:5: model.core.d_stat: unknown key")  # extras come last
    assert [line.split(": ", 2)[1] for line in lines] == [".".join(loc) for loc, *_ in err.errors]
    assert_points_at_key(err, text)


def test_prefix_for_a_params_model_validated_alone():
    text = GOOD.replace("d_state", "d_stat")
    data, positions = load_yaml(text, "spec.yaml")
    with pytest.raises(ValidationError) as info:
        S4DParams.model_validate(data["model"]["core"])
    err = format_validation_error(info.value, positions, prefix=("model", "core"), model=S4DParams)
    assert str(err) == "spec.yaml:4:5: model.core.d_stat: unknown key 'd_stat'; did you mean 'd_state'?"


def test_list_items_and_dict_values():
    text = GOOD + "  layers:\n    - {dropout: 0.1}\n    - dropot: 0.2\n  named:\n    a: {dropuot: 1.0}\n"
    err, _ = validate(text)
    assert str(err).splitlines() == [
        "spec.yaml:8:7: model.layers.1.dropot: unknown key 'dropot'; did you mean 'dropout'?",
        "spec.yaml:10:9: model.named.a.dropuot: unknown key 'dropuot'; did you mean 'dropout'?",
    ]
    assert_points_at_key(err, text)


def test_discriminated_union_tag_is_not_in_the_path():
    err, text = validate(GOOD + "  mixer:\n    kind: mamba\n    d_cnv: 3\n")
    assert str(err) == "spec.yaml:8:5: model.mixer.d_cnv: unknown key 'd_cnv'; did you mean 'd_conv'?"
    assert_points_at_key(err, text)


def test_unknown_discriminator_value_points_at_the_tag_key():
    err, _ = validate(GOOD + "  mixer:\n    kind: mamb\n")
    (line,) = str(err).splitlines()
    assert line.startswith("spec.yaml:7:5: model.mixer.kind: Input tag 'mamb' found using 'kind'")
    assert line.endswith("did you mean 'mamba'?")


def test_smart_union_member_names_are_not_in_the_path():
    err, _ = validate(GOOD + "  either: {kind: s4d, d_sate: 2}\n  width: [1]\n")
    lines = str(err).splitlines()
    assert "spec.yaml:6:23: model.either.d_sate: unknown key 'd_sate'; did you mean 'd_state'?" in lines
    assert "spec.yaml:7:3: model.width: Input should be a valid integer" in lines
    assert not any("S4DParams" in line or "MambaParams" in line or ".int:" in line for line in lines)


def test_union_tags_dropped_from_the_file_alone_when_no_model_given():
    data, positions = load_yaml(GOOD + "  either: {kind: s4d, d_sate: 2}\n", "spec.yaml")
    with pytest.raises(ValidationError) as info:
        Spec.model_validate(data)
    lines = str(format_validation_error(info.value, positions)).splitlines()
    assert "spec.yaml:6:23: model.either.d_sate: unknown key 'd_sate'" in lines


def test_positions_from_a_dict_give_path_without_line():
    with pytest.raises(ValidationError) as info:
        Spec.model_validate({"schema_version": 1, "model": {"d_model": 1, "core": {"d_stat": 1}}})
    err = format_validation_error(info.value, Positions("<dict>", {}), model=Spec)
    assert str(err) == "<dict>: model.core.d_stat: unknown key 'd_stat'; did you mean 'd_state'?"
    assert err.errors[0][1:3] == (None, None)


def test_model_level_error_has_no_path():
    class Pair(BaseModel):
        model_config = STRICT
        a: int

        @model_validator(mode="after")
        def check(self) -> "Pair":
            if self.a < 0:
                raise ValueError("a must be >= 0")
            return self

    with pytest.raises(ValidationError) as info:
        Pair.model_validate({"a": -1})
    err = format_validation_error(info.value, load_yaml("a: -1\n", "p.yaml")[1], model=Pair)
    assert str(err).startswith("p.yaml:1:1: ") and "a must be >= 0" in str(err)


def test_spec_error_points_at_key_or_nearest_ancestor():
    text = GOOD + "  backend: fast\n"
    _, positions = load_yaml(text, "spec.yaml")
    err = spec_error(positions, ("model", "backend"), "unknown backend 'fast'; did you mean 'fla'?")
    assert str(err) == "spec.yaml:6:3: model.backend: unknown backend 'fast'; did you mean 'fla'?"
    assert err.errors == [(("model", "backend"), 6, 3, "unknown backend 'fast'; did you mean 'fla'?")]
    err = spec_error(positions, ("model", "core", "kind"), "unknown core")
    assert str(err) == "spec.yaml:3:3: model.core.kind: unknown core"
    assert isinstance(err, SpecError)
