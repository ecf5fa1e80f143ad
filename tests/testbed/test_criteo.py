"""Criteo TSV loader against a plain per-line Python parser; shipped samples; streaming windows.

Run alone: python3 -m pytest -q tests/testbed/test_criteo.py
"""
import hashlib
import math
from pathlib import Path

import numpy as np
import pytest

from embnic.client_lib.config import parse_config
from embnic.testbed.training import criteo
from embnic.testbed.training.criteo import (MISSING_CAT, CriteoFormatError, default_tables, iter_criteo, load_criteo,
                                   sample_path, time_split)

M64 = (1 << 64) - 1
ROWS = [1000 + 37 * j for j in range(26)]  # a different id space per column


def _splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _fold(h: int, rows):
    return h if rows is None else h % rows


def _reference(path, rows):
    """Straightforward per-line parse (the spec of the loader, written the slow way)."""
    labels, dense, sparse = [], [], []
    for line in Path(path).read_text().splitlines():
        if not line:
            continue
        f = line.split("\t")
        if len(f) == 40:
            labels.append(float(f[0]))
            f = f[1:]
        else:
            labels.append(math.nan)
        dense.append([math.log1p(max(int(x), 0)) if x else 0.0 for x in f[:13]])
        sparse.append([_fold(_splitmix64((j << 40) | (int(x, 16) if x else MISSING_CAT)), rows[j])
                       for j, x in enumerate(f[13:])])
    return (np.array(labels, np.float32), np.array(dense, np.float32).reshape(-1, 13),
            np.array(sparse, np.uint64).reshape(-1, 26))


def _same(d, ref):
    labels, dense, sparse = ref
    np.testing.assert_array_equal(d.labels, labels)
    np.testing.assert_array_equal(d.dense, dense)
    np.testing.assert_array_equal(d.sparse, sparse)


# ---- shipped data ----------------------------------------------------------------------------

@pytest.mark.parametrize("which,sha", [
    ("train", "42ccd942379b52c341356fd1fb6ff9d2d6c7a63d9a1ebbd6da30fa44b5bf5dc2"),
    ("test", "b97ef3f0a4180d3c0df0005f057d78abf6edffea6a3609114a6dbb5b0b335360"),
])
def test_shipped_sample_checksum_and_readme(which, sha):
    p = sample_path(which)
    assert hashlib.sha256(p.read_bytes()).hexdigest() == sha
    readme = (p.parent / "README.md").read_text()
    assert sha in readme
    for must in ("ChenglongChen/kaggle-2014-criteo", "Apache-2.0", "non-commercial", "Criteo"):
        assert must in readme


def test_train_sample_matches_reference():
    d = load_criteo(sample_path("train"), rows=ROWS)
    assert len(d) == 6435 and d.has_labels and int(d.labels.sum()) == 1506
    assert d.labels.dtype == np.float32 and d.dense.dtype == np.float32 and d.sparse.dtype == np.uint64
    assert d.dense.shape == (6435, 13) and d.sparse.shape == (6435, 26)
    _same(d, _reference(sample_path("train"), ROWS))
    assert np.all(d.sparse < np.array(ROWS, np.uint64))
    # missing categoricals exist in the sample and map to the column's fixed id
    missing_c20 = criteo.hash_categorical(19, np.array([MISSING_CAT], np.uint64), ROWS[19])[0]
    assert np.any(d.sparse[:, 19] == missing_c20)


def test_test_sample_has_no_labels():
    d = load_criteo(sample_path("test"), rows=ROWS)
    assert len(d) == 1999 and not d.has_labels and np.all(np.isnan(d.labels))
    _same(d, _reference(sample_path("test"), ROWS))


# ---- streaming ---------------------------------------------------------------------------------

@pytest.mark.parametrize("chunk_bytes,batch_lines", [(997, 7), (64 << 10, 1000), (16 << 20, 1 << 16)])
def test_streaming_equals_whole(chunk_bytes, batch_lines):
    whole = load_criteo(sample_path("train"))
    blocks = list(iter_criteo(sample_path("train"), chunk_bytes=chunk_bytes, batch_lines=batch_lines))
    assert all(0 < len(b) <= batch_lines for b in blocks)
    assert [b.first_line for b in blocks] == list(np.cumsum([0] + [len(b) for b in blocks[:-1]]))
    np.testing.assert_array_equal(np.concatenate([b.sparse for b in blocks]), whole.sparse)
    np.testing.assert_array_equal(np.concatenate([b.dense for b in blocks]), whole.dense)
    np.testing.assert_array_equal(np.concatenate([b.labels for b in blocks]), whole.labels)


@pytest.mark.parametrize("skip,maxr", [(0, 1), (100, 50), (6400, 100), (6435, 10), (0, None), (3000, None)])
def test_skip_and_max_rows_window(skip, maxr):
    whole = load_criteo(sample_path("train"))
    d = load_criteo(sample_path("train"), skip_rows=skip, max_rows=maxr, chunk_bytes=4096)
    end = len(whole) if maxr is None else min(len(whole), skip + maxr)
    assert len(d) == end - skip and d.first_line == skip
    np.testing.assert_array_equal(d.sparse, whole.sparse[skip:end])
    np.testing.assert_array_equal(d.dense, whole.dense[skip:end])


# ---- format edge cases ---------------------------------------------------------------------

def _line(label="1", ints=None, cats=None):
    ints = ints if ints is not None else [str(i) for i in range(13)]
    cats = cats if cats is not None else [f"{j:08x}" for j in range(26)]
    return "\t".join(([label] if label is not None else []) + ints + cats)


def test_missing_negative_crlf_empty_lines_no_trailing_newline(tmp_path):
    ints = ["", "-5", "0", "7"] + [""] * 9
    cats = [""] + ["deadbeef"] * 25
    text = _line("0", ints, cats) + "\r\n\r\n" + _line() + "\n\n" + _line("1", ints, cats)  # no final \n
    p = tmp_path / "x.tsv"
    p.write_bytes(text.encode())
    d = load_criteo(p, rows=ROWS)
    assert len(d) == 3
    np.testing.assert_array_equal(d.labels, [0, 1, 1])
    np.testing.assert_array_equal(d.dense[0, :4], np.log1p([0, 0, 0, 7]).astype(np.float32))
    assert np.all(d.dense[0, 4:] == 0)
    want_missing = _splitmix64(MISSING_CAT) % ROWS[0]
    assert d.sparse[0, 0] == want_missing == d.sparse[2, 0]
    assert d.sparse[0, 1] == _splitmix64((1 << 40) | 0xDEADBEEF) % ROWS[1]
    q = tmp_path / "lf.tsv"
    q.write_text(text.replace("\r", "") + "\n")
    _same(load_criteo(q, rows=ROWS), _reference(q, ROWS))


@pytest.mark.parametrize("bad,match", [
    (_line(cats=["zz000000"] + ["0"] * 25), ":2: a field"),
    (_line(cats=["123456789"] + ["0"] * 25), ":2: a field"),
    (_line(label="2"), ":2: a field"),
    (_line(label=""), ":2: a field"),
    (_line(ints=["1x"] + ["1"] * 12), ":2: a field"),
    (_line(ints=["-"] + ["1"] * 12), ":2: a field"),
    (_line() + "\textra", ":2: 41 fields, expected 40"),
    ("\t".join(["1"] * 10), ":2: 10 fields, expected 40"),
])
def test_malformed_line_names_file_and_line(tmp_path, bad, match):
    p = tmp_path / "bad.tsv"
    p.write_text(_line() + "\n" + bad + "\n" + _line() + "\n")
    with pytest.raises(CriteoFormatError, match=match):
        load_criteo(p)


def test_first_line_field_count_checked(tmp_path):
    p = tmp_path / "bad.tsv"
    p.write_text("a\tb\tc\n")
    with pytest.raises(CriteoFormatError, match="bad.tsv:1: 3 fields"):
        load_criteo(p)


def test_missing_file_raises_oserror(tmp_path):
    with pytest.raises(OSError):
        load_criteo(tmp_path / "nope.tsv")


def test_full_64_bit_ids_option():
    """rows=None keeps the whole 64-bit hash (no folding): per column, or for all columns."""
    rows = [None] * 13 + ROWS[13:]
    d = load_criteo(sample_path("train"), rows=rows)
    _same(d, _reference(sample_path("train"), rows))
    assert d.rows == tuple(rows)
    assert int(d.sparse[:, :13].max()) >= 2**63  # ids use the top bits (a few thousand ids: surely)
    assert np.all(d.sparse[:, 13:] < np.array(ROWS[13:], np.uint64))
    full = load_criteo(sample_path("train"), rows=None, max_rows=50)
    np.testing.assert_array_equal(full.sparse[:, :13], d.sparse[:50, :13])
    # distinct raw values of a column never share an id (splitmix64 is a bijection)
    raw = [line.split("\t")[14 + 2] for line in sample_path("train").read_text().splitlines()]
    assert len(set(raw)) == np.unique(d.sparse[:, 2]).size
    cfg = parse_config({"tables": default_tables(rows=None), "shards": [{"id": 0, "ip": "127.0.0.1"}],
                        "clients": [{"id": 1, "ip": "127.0.0.1"}]})
    assert {t.rows for t in cfg.tables} == {None}


# ---- helpers --------------------------------------------------------------------------------

def test_default_tables_make_a_valid_config():
    tabs = default_tables(rows=ROWS, dim=16, optimizer="sgd", lr=0.1)
    assert [t["name"] for t in tabs] == [f"C{i}" for i in range(1, 27)]
    cfg = parse_config({"tables": tabs, "shards": [{"id": 0, "ip": "127.0.0.1"}],
                        "clients": [{"id": 1, "ip": "127.0.0.1"}]})
    assert [t.rows for t in cfg.tables] == ROWS and {t.dim for t in cfg.tables} == {16}
    assert {t.optimizer for t in cfg.tables} == {"sgd"}
    with pytest.raises(ValueError, match="26"):
        default_tables(rows=[1, 2, 3])


def batches(data, batch_size: int, *, drop_last: bool = False):
    """Consecutive batches of ``batch_size`` samples of ``data`` (the last may be shorter)."""
    n = len(data)
    for s in range(0, n, batch_size):
        if drop_last and s + batch_size > n:
            return
        yield data[s:s + batch_size]


def sparse_to_jagged(sparse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """uint64 (B, F) one-id-per-bag features → TorchRec's feature-major (values uint64 (F*B,),
    lengths int32 (F*B,)): ``values[f*B + b] = sparse[b, f]``."""
    s = np.asarray(sparse, dtype=np.uint64)
    return np.ascontiguousarray(s.T).reshape(-1), np.ones(s.size, dtype=np.int32)


def test_time_split_and_batches():
    d = load_criteo(sample_path("train"))
    tr, va = time_split(d, 0.2)
    assert len(tr) + len(va) == len(d) and len(va) == round(0.2 * len(d))
    assert va.first_line == len(tr)
    np.testing.assert_array_equal(va.sparse, d.sparse[len(tr):])
    sizes = [len(b) for b in batches(d, 1000)]
    assert sizes == [1000] * 6 + [435]
    assert [len(b) for b in batches(d, 1000, drop_last=True)] == [1000] * 6
    with pytest.raises(ValueError):
        time_split(d, 1.0)


def test_jagged_layout_is_feature_major():
    values, lengths = sparse_to_jagged(np.array([[1, 2], [3, 4]], np.uint64))
    assert values.tolist() == [1, 3, 2, 4] and lengths.tolist() == [1, 1, 1, 1]
    d = load_criteo(sample_path("train"), max_rows=5)
    v, ln = sparse_to_jagged(d.sparse)
    assert v.shape == (130,) and v[5 * 3 + 2] == d.sparse[2, 3] and ln.sum() == 130


@pytest.mark.parametrize("module", ["gzip", "bz2", "lzma"])
def test_compressed_files_are_read_by_their_magic_bytes(tmp_path, module):
    """Issue 23: `--data x.tsv.gz` said '1 fields, expected 40'. gzip, bzip2 and xz stream (also
    in small chunks, across block boundaries), whatever the file is called."""
    import importlib

    mod = importlib.import_module(module)
    raw = sample_path("train").read_bytes()
    p = tmp_path / "train.data"  # no telling suffix: the magic bytes decide
    with mod.open(p, "wb") as f:
        f.write(raw)
    _same(load_criteo(p, rows=ROWS), _reference(sample_path("train"), ROWS))
    part = load_criteo(sample_path("train"), rows=ROWS, skip_rows=10, max_rows=300)
    _same(load_criteo(p, rows=ROWS, chunk_bytes=4096, skip_rows=10, max_rows=300),
          (part.labels, part.dense, part.sparse))


def test_compressed_formats_it_cannot_read_are_named(tmp_path):
    import gzip
    import io
    import tarfile
    import zipfile

    cases = {}
    cases["x.zst"] = (b"\x28\xb5\x2f\xfd" + b"\x00" * 20, r"x.zst is zstd-compressed; decompress it first \(unzstd")
    zp = io.BytesIO()
    with zipfile.ZipFile(zp, "w") as z:
        z.writestr("train.txt", _line() + "\n")
    cases["x.zip"] = (zp.getvalue(), r"x.zip is zip-compressed; decompress it first \(unzip")
    tp = io.BytesIO()
    with tarfile.open(fileobj=tp, mode="w:gz") as t:  # Kaggle's dac.tar.gz
        data = (_line() + "\n").encode()
        info = tarfile.TarInfo("train.txt")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    cases["dac.tar.gz"] = (tp.getvalue(), r"dac.tar.gz is a gzip-compressed tar archive; extract it first")
    cases["x.bin"] = (bytes(range(256)) * 4, r"x.bin is binary data, not a Criteo TSV")
    good = gzip.compress(((_line() + "\n") * 50).encode())
    cases["cut.gz"] = (good[:len(good) // 2], r"cut.gz: corrupt or truncated compressed data")
    cases["bad.gz"] = (good[:10] + b"\xff" * 40, r"bad.gz: corrupt or truncated compressed data")
    for name, (data, msg) in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(CriteoFormatError, match=msg):
            load_criteo(p)
