"""Catalog loading: the whole catalog is refused on the first problem, naming the file and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from examlops.core.errors import CatalogError, ModelNotFound
from examlops.core.settings import Settings
from examlops.registry.catalog import load_catalog


def _entry(name: str = "JPCP", uuid: str = "57dcdb81-15d8-5512-8e93-3f86bc59ad53", **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "seanerbus_uuid": uuid,
        "input_schema": {
            "embedding": {"type": "float_array", "length": 384},
            "node_count": {"type": "integer", "minimum": 1},
        },
    }
    entry.update(extra)
    return entry


def _write(folder: Path, file: str, data: Any) -> None:
    (folder / file).write_text(yaml.safe_dump(data), encoding="utf-8")


def _refusal(folder: Path) -> CatalogError:
    with pytest.raises(CatalogError) as caught:
        load_catalog(folder)
    return caught.value


def test_shipped_demo_catalog_loads_three_models() -> None:
    catalog = load_catalog(Settings().catalog_path)
    assert sorted(catalog.names) == ["AC", "CRCP", "JPCP"]
    assert all(spec.embedding_dim == 384 for spec in catalog)


def test_bad_uuid_names_file_and_field(tmp_path: Path) -> None:
    _write(tmp_path, "jpcp.yaml", _entry(uuid="not-a-uuid"))
    error = _refusal(tmp_path)
    assert (error.file, error.field) == ("jpcp.yaml", "seanerbus_uuid")
    assert "jpcp.yaml" in str(error) and "seanerbus_uuid" in str(error) and "not-a-uuid" in str(error)


def test_duplicate_name_is_refused_case_insensitively(tmp_path: Path) -> None:
    _write(tmp_path, "a.yaml", _entry(name="JPCP"))
    _write(tmp_path, "b.yaml", _entry(name="jpcp", uuid="11111111-1111-1111-1111-111111111111"))
    error = _refusal(tmp_path)
    assert (error.file, error.field) == ("b.yaml", "name")
    assert "a.yaml" in str(error)


def test_duplicate_uuid_names_both_files(tmp_path: Path) -> None:
    _write(tmp_path, "a.yaml", _entry(name="JPCP"))
    _write(tmp_path, "b.yaml", _entry(name="CRCP"))
    error = _refusal(tmp_path)
    assert (error.file, error.field) == ("b.yaml", "seanerbus_uuid")
    assert "a.yaml" in str(error)


def test_unknown_field_type_names_the_field_path(tmp_path: Path) -> None:
    entry = _entry()
    entry["input_schema"]["node_count"] = {"type": "complex"}
    _write(tmp_path, "jpcp.yaml", entry)
    error = _refusal(tmp_path)
    assert error.file == "jpcp.yaml"
    assert error.field is not None and error.field.startswith("input_schema.node_count")
    assert "unknown type 'complex'" in str(error)


def test_missing_field_names_it(tmp_path: Path) -> None:
    entry = _entry()
    del entry["input_schema"]
    _write(tmp_path, "jpcp.yaml", entry)
    error = _refusal(tmp_path)
    assert (error.file, error.field) == ("jpcp.yaml", "input_schema")


def test_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("name: [unclosed\n", encoding="utf-8")
    assert _refusal(tmp_path).file == "broken.yaml"


def test_empty_or_missing_folder_is_refused(tmp_path: Path) -> None:
    assert "no *.yaml" in str(_refusal(tmp_path))
    assert "does not exist" in str(_refusal(tmp_path / "absent"))


def test_lookup_by_name_is_case_insensitive_and_unknown_name_raises(tmp_path: Path) -> None:
    _write(tmp_path, "jpcp.yaml", _entry())
    catalog = load_catalog(tmp_path)
    assert catalog.get("jpcp").name == "JPCP"
    with pytest.raises(ModelNotFound):
        catalog.get("nope")


def test_only_keeps_the_named_models_in_catalog_order_and_names_every_unknown_one() -> None:
    catalog = load_catalog(Settings().catalog_path)
    assert catalog.only(["jpcp", "AC"]).names == tuple(n for n in catalog.names if n in ("AC", "JPCP"))
    with pytest.raises(ModelNotFound) as caught:
        catalog.only(["JPCP", "nope", "other"])
    assert "'nope', 'other'" in str(caught.value) and "known: " in str(caught.value)
    with pytest.raises(ModelNotFound):
        catalog.only([])


def test_an_embedding_without_a_length_takes_the_embedding_dim_setting(tmp_path: Path) -> None:
    from examlops import bootstrap

    entry = _entry()
    del entry["input_schema"]["embedding"]["length"]
    _write(tmp_path, "jpcp.yaml", entry)
    _write(tmp_path, "crcp.yaml", _entry(name="CRCP", uuid="11111111-1111-1111-1111-111111111111"))
    catalog = bootstrap.catalog(Settings(catalog_dir=tmp_path, embedding_dim=16))
    assert catalog.get("JPCP").embedding_dim == 16
    assert catalog.get("CRCP").embedding_dim == 384  # a length the YAML gives wins over the setting
    assert load_catalog(tmp_path).get("JPCP").embedding_dim == Settings().embedding_dim == 384


def test_the_embedding_dim_setting_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from examlops import bootstrap

    entry = _entry()
    del entry["input_schema"]["embedding"]["length"]
    _write(tmp_path, "jpcp.yaml", entry)
    monkeypatch.setenv("EXAMLOPS_CATALOG_DIR", str(tmp_path))
    monkeypatch.setenv("EXAMLOPS_EMBEDDING_DIM", "8")
    assert bootstrap.catalog(Settings()).get("jpcp").embedding_dim == 8


def test_a_task_name_that_cannot_be_one_names_the_file_and_the_task(tmp_path: Path) -> None:
    _write(tmp_path, "jpcp.yaml", _entry(tasks=["pavement.distress.jpcp", "has space"]))
    error = _refusal(tmp_path)
    assert (error.file, error.field) == ("jpcp.yaml", "tasks.1")
