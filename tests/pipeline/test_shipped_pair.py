"""The shipped default pair: staged only when every file matches its recorded sha256, trained to its schedule."""

import json

import pytest

from ddtree.pipeline.stage import (
    ShippedPairError,
    shipped_pair_dir,
    stage_shipped_pair,
    verify_checksums,
    write_checksums,
)


def _fake_pair(root):
    (root / "target").mkdir(parents=True)
    (root / "target" / "config.json").write_text("{}")
    (root / "drafter").mkdir()
    (root / "drafter" / "config.json").write_text('{"block_size": 16}')
    (root / "manifest.json").write_text(json.dumps({"training": {"complete": True}}))
    write_checksums(root)
    return root


def test_checksums_catch_a_changed_a_missing_and_an_extra_file(tmp_path):
    root = _fake_pair(tmp_path / "pair")
    assert set(verify_checksums(root)) == {"target/config.json", "drafter/config.json", "manifest.json"}
    (root / "drafter" / "config.json").write_text('{"block_size": 8}')
    with pytest.raises(ShippedPairError, match="drafter/config.json has sha256"):
        verify_checksums(root)
    write_checksums(root)
    (root / "extra.bin").write_bytes(b"x")
    with pytest.raises(ShippedPairError, match="extra.bin is not listed"):
        verify_checksums(root)
    (root / "extra.bin").unlink()
    (root / "target" / "config.json").unlink()
    with pytest.raises(ShippedPairError, match="target/config.json is listed"):
        verify_checksums(root)


def test_unknown_shipped_pair_names_the_way_forward(tmp_path):
    with pytest.raises(ShippedPairError, match="weights: train"):
        stage_shipped_pair("small", 12345, tmp_path / "out")


def test_the_shipped_default_pair_verifies_and_was_trained_to_its_schedule(tmp_path):
    source = shipped_pair_dir("small", 0)
    assert source.is_dir(), "the default small pair (seed 0) must ship with the package"
    manifest = stage_shipped_pair("small", 0, tmp_path / "embedded-small")
    training = manifest["training"]
    assert training["complete"] is True and training["incomplete_reason"] is None
    assert training["target"]["stopped_by"] == "max_steps" == training["drafter"]["stopped_by"]
    assert training["target"]["steps"] == manifest["size"]["target_max_steps"]
    assert training["drafter"]["steps"] == manifest["size"]["drafter_max_steps"]
    assert manifest["size"]["schedule"] == "steps"
    from ddtree.models.pair import load_pair

    pair = load_pair(tmp_path / "embedded-small")
    assert pair.drafter.config.block_size == manifest["size"]["block_size"]
