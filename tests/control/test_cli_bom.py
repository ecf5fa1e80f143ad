"""A byte-order mark in a config or a data file (issue 34): a UTF-8 BOM is skipped (configs and
Criteo TSVs saved by Windows editors), UTF-16 text is named with the command that converts it;
before, a BOM made any config "Invalid statement (at line 1, column 1)" and a TSV's first line
malformed without saying why.

Run alone: python3 -m pytest -q tests/control/test_cli_bom.py
"""
from __future__ import annotations

import codecs
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from embnic.client_lib.config import ConfigError, load_config
from embnic.cli.main import cli
from embnic.testbed.training import criteo

ROOT = Path(__file__).resolve().parents[2]
TESTBED = ROOT / "examples" / "testbed.toml"


def _run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], prog_name="embnic")


def test_a_config_with_a_utf8_bom_loads_as_without(tmp_path):
    p = tmp_path / "c.toml"
    p.write_bytes(TESTBED.read_bytes())
    plain, plain_show = load_config(p), _run("config", "show", p, "--json").output
    p.write_bytes(codecs.BOM_UTF8 + TESTBED.read_bytes())
    assert load_config(p) == plain
    r = _run("config", "check", p)
    assert r.exit_code == 0, r.output
    r = _run("config", "show", p, "--json")
    assert r.exit_code == 0 and json.loads(r.output) == json.loads(plain_show)


def test_an_invalid_config_with_a_bom_names_its_own_fault(tmp_path):
    """The BOM is not the fault any more: the real one is named (a field, a TOML error past line 1)."""
    bad = tmp_path / "bad.toml"
    bad.write_bytes(codecs.BOM_UTF8 + TESTBED.read_bytes().replace(b"mtu = ", b"mtux = ", 1))
    r = _run("config", "check", bad)
    assert r.exit_code == 2 and "mtux" in r.output and "line 1, column 1" not in r.output, r.output
    broken = tmp_path / "broken.toml"
    broken.write_bytes(codecs.BOM_UTF8 + b"[cluster]\nname = \n")
    with pytest.raises(ConfigError, match=r"not valid TOML: .*line 2") as e:
        load_config(broken)
    assert "line 1, column 1" not in str(e.value)


@pytest.mark.parametrize("bom", [codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE])
def test_a_utf16_config_is_named_with_the_fix(tmp_path, bom):
    p = tmp_path / "u16.toml"
    p.write_bytes(bom + TESTBED.read_text().encode("utf-16-le" if bom == codecs.BOM_UTF16_LE else "utf-16-be"))
    r = _run("config", "check", p)
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1 and "UTF-16" in r.output and "iconv -f UTF-16 -t UTF-8" in r.output


def _sample_lines(n: int = 300) -> bytes:
    with open(criteo.sample_path("train"), "rb") as f:
        return b"".join(f.readline() for _ in range(n))


def test_a_criteo_tsv_with_a_utf8_bom_reads_as_without(tmp_path):
    plain, bom = tmp_path / "plain.tsv", tmp_path / "bom.tsv"
    plain.write_bytes(_sample_lines())
    bom.write_bytes(codecs.BOM_UTF8 + _sample_lines())
    a, b = criteo.load_criteo(plain), criteo.load_criteo(bom)
    assert len(a.labels) == len(b.labels) == 300
    for f in ("labels", "dense", "sparse"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    # through the CLI: plan --data reads it (as train, trace record and demo do)
    r = _run("plan", "-c", TESTBED, "--batch", "64", "--data", bom, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["workload"]["source"] == str(bom)


def test_a_utf16_criteo_tsv_is_named_with_the_fix(tmp_path):
    p = tmp_path / "u16.tsv"
    p.write_bytes(codecs.BOM_UTF16_LE + _sample_lines(20).decode().encode("utf-16-le"))
    with pytest.raises(criteo.CriteoFormatError, match="UTF-16 text .*iconv -f UTF-16 -t UTF-8"):
        criteo.load_criteo(p)
    r = _run("plan", "-c", TESTBED, "--batch", "8", "--data", p)
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and "UTF-16" in r.output, r.output
