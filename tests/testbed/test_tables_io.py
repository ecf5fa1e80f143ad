"""`embnic tables export|import`: trained tables out of the shards' directories and back in.

Run alone: python3 -m pytest -q tests/testbed/test_tables_io.py
"""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from embnic.client_lib.client import EmbeddingClient
from embnic.client_lib.local import LocalBackend
from embnic.client_lib.table_numerics import init_rows
from embnic.cli.main import cli
from embnic.testbed.server import tables_io as TIO
from embnic.testbed.server.runner import ServerCluster, ServerThread

from test_server import make_cfg

NOROWS = [{"id": 0, "dim": 8, "optimizer": "adagrad", "lr": 0.1, "name": "users"},
          {"id": 5, "dim": 4, "optimizer": "sgd", "lr": 0.3}]


def save_safetensors(path, tensors: dict, metadata: dict) -> None:
    """Write ``tensors`` (float32 / float16 / uint64 arrays) as a safetensors file, deterministically."""
    head, _ = TIO.safetensors_header({n: (a.dtype, a.shape) for n, a in tensors.items()}, metadata)
    with open(path, "wb") as f:
        f.write(head)
        for n in sorted(tensors):
            f.write(np.ascontiguousarray(tensors[n]).astype(tensors[n].dtype.newbyteorder("<"), copy=False).tobytes())


def _write_cfg(tmp_path, cfg_tables):
    lines = ["[cluster]", "seed = 42", 'sharding = "hash"']
    for t in cfg_tables:
        lines.append("[[tables]]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in t.items()]
    for i in range(2):
        lines += ["[[shards]]", f"id = {i}", 'ip = "127.0.0.1"', f"port = {7900 + i}"]
    lines += ["[[clients]]", "id = 1", 'ip = "127.0.0.1"']
    p = tmp_path / "c.toml"
    p.write_text("\n".join(lines) + "\n")
    return p


def _train(cfg, ckdir, seed=0, steps=6):
    """Updates through a 2-shard cluster that logs to ``ckdir``; returns the LocalBackend twin."""
    ref = LocalBackend(cfg)
    rng = np.random.default_rng(seed)
    with ServerCluster(cfg, checkpoint_dir=str(ckdir), checkpoint_every=3) as cl, \
            EmbeddingClient(cl.cfg, 1, bind=("127.0.0.1", 0)) as c:
        for _ in range(steps):
            ups = {}
            for t in cfg.tables:
                hi = t.rows if t.rows is not None else 2**64
                k = np.unique(rng.integers(0, min(hi, 2**63), 200, dtype=np.uint64)
                              if t.rows is not None else rng.integers(0, 2**63, 200, dtype=np.uint64) * 2)
                g = rng.standard_normal((k.size, t.dim)).astype(np.float32)
                ups[t.id] = (k, g)
                ref.update({t.id: (k, g)})
            c.update(ups)
    return ref


def _run(*args):
    return CliRunner().invoke(cli, list(map(str, args)))


@pytest.mark.parametrize("layout", ["torchrec", "ids"])
def test_export_import_export_is_byte_identical_and_serves_the_rows(tmp_path, layout):
    cfg_path = _write_cfg(tmp_path, [{k: v for k, v in t.items()} | {"name": f"t{t['id']}"}
                                     for t in __import__("test_server").TABLES])
    from embnic.client_lib.config import load_config

    cfg = load_config(str(cfg_path))
    ref = _train(cfg, tmp_path / "run")
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    r = _run("tables", "export", "-c", cfg_path, "--from", tmp_path / "run", "--out", a, "--layout", layout)
    assert r.exit_code == 0, r.output
    tensors, meta = TIO.load_safetensors(a)
    assert meta["format"] == "embnic-tables" and meta["layout"] == layout
    for t in cfg.tables:
        if layout == "torchrec":
            w = tensors[f"embedding_bags.t{t.id}.weight"]
            assert w.shape == (t.rows, t.dim) and w.dtype == np.float32
            k, rows, _ = ref.state_dict()[t.id]  # master (float32) rows, not fp16-rounded lookups
            assert np.array_equal(w[k.astype(np.int64)], rows)
            rest = np.setdiff1d(np.arange(t.rows, dtype=np.uint64), k)
            assert np.array_equal(w[rest.astype(np.int64)], init_rows(cfg.seed, t.id, rest, t.dim, t.init_scale))
        else:
            k, rows, acc = ref.state_dict()[t.id]
            assert np.array_equal(tensors[f"tables.t{t.id}.ids"], k)
            assert np.array_equal(tensors[f"tables.t{t.id}.weight"], rows)
            assert np.array_equal(tensors[f"tables.t{t.id}.acc"], acc)
    r = _run("tables", "import", "-c", cfg_path, a, "--into", tmp_path / "new", "--json")
    assert r.exit_code == 0, r.output
    assert sum(json.loads(r.output)["rows"].values()) > 0
    r = _run("tables", "export", "-c", cfg_path, "--from", tmp_path / "new", "--out", b, "--layout", layout)
    assert r.exit_code == 0, r.output
    assert a.read_bytes() == b.read_bytes()
    # a shard restored from the imported directory serves the exported rows
    t = cfg.tables[0]
    with ServerCluster(cfg, restore=str(tmp_path / "new")) as cl, \
            EmbeddingClient(cl.cfg, 1, bind=("127.0.0.1", 0)) as c:
        keys = np.arange(t.rows, dtype=np.uint64)
        got = c.lookup({t.id: keys})[t.id]
    assert np.array_equal(got, ref.lookup({t.id: keys})[t.id])
    # importing over a used directory is refused
    r = _run("tables", "import", "-c", cfg_path, a, "--into", tmp_path / "new")
    assert r.exit_code == 2 and "already holds" in r.output


def test_collision_free_tables_export_by_id_and_refuse_torchrec(tmp_path):
    cfg_path = _write_cfg(tmp_path, NOROWS)
    from embnic.client_lib.config import load_config

    cfg = load_config(str(cfg_path))
    ref = _train(cfg, tmp_path / "run", steps=3)
    out = tmp_path / "x.safetensors"
    r = _run("tables", "export", "-c", cfg_path, "--from", tmp_path / "run", "--out", out, "--layout", "torchrec")
    assert r.exit_code == 2 and "has no rows" in r.output and "--layout ids" in r.output
    r = _run("tables", "export", "-c", cfg_path, "--from", tmp_path / "run", "--out", out)  # default: ids
    assert r.exit_code == 0 and "(ids)" in r.output, r.output
    tensors, _ = TIO.load_safetensors(out)
    k = tensors["tables.users.ids"]
    assert k.dtype == np.uint64 and int(k.max()) > 2**62  # full 64-bit ids, not folded
    assert np.array_equal(tensors["tables.users.weight"], ref.state_dict()[0][1])
    r = _run("tables", "import", "-c", cfg_path, out, "--into", tmp_path / "new")
    assert r.exit_code == 0, r.output
    out2 = tmp_path / "y.safetensors"
    assert _run("tables", "export", "-c", cfg_path, "--from", tmp_path / "new", "--out", out2).exit_code == 0
    assert out.read_bytes() == out2.read_bytes()


def test_torchrec_layout_refuses_a_table_too_large_to_write_dense(tmp_path):
    cfg_path = _write_cfg(tmp_path, [{"id": 0, "rows": 2**40, "dim": 8, "name": "huge"}])
    for i in range(2):  # the shards ran with --checkpoint-dir run but logged nothing
        (tmp_path / "run" / f"shard-{i}").mkdir(parents=True)
    out = tmp_path / "h.safetensors"
    r = _run("tables", "export", "-c", cfg_path, "--from", tmp_path / "run", "--out", out, "--layout", "torchrec")
    assert r.exit_code == 2 and "32768 GiB" in r.output and "--layout ids" in r.output
    r = _run("tables", "export", "-c", cfg_path, "--from", tmp_path / "run", "--out", out)  # default: ids
    assert r.exit_code == 0 and "(ids)" in r.output, r.output


def test_export_refuses_a_directory_without_the_shards(tmp_path):
    """--from a directory the shards never ran in (a typo, the parent directory) would export the
    initial rows as if trained: refused, naming the missing shard directory (exit 2)."""
    cfg_path = _write_cfg(tmp_path, [{"id": 0, "rows": 1000, "dim": 4, "name": "small"}])
    (tmp_path / "empty").mkdir()
    out = tmp_path / "e.safetensors"
    r = _run("tables", "export", "-c", cfg_path, "--from", tmp_path / "empty", "--out", out)
    assert r.exit_code == 2, r.output
    assert f"{tmp_path / 'empty'} has no shard-0, shard-1 directories" in r.output and "--checkpoint-dir" in r.output
    assert not out.exists()
    (tmp_path / "empty" / "shard-0").mkdir()  # one shard of two: still refused, naming the other
    r = _run("tables", "export", "-c", cfg_path, "--from", tmp_path / "empty", "--out", out)
    assert r.exit_code == 2 and "has no shard-1 directory" in r.output and not out.exists(), r.output


def test_import_refuses_a_file_that_does_not_fit(tmp_path):
    cfg_path = _write_cfg(tmp_path, NOROWS)
    bad = tmp_path / "bad.safetensors"
    save_safetensors(bad, {"tables.users.ids": np.arange(3, dtype=np.uint64),
                               "tables.users.weight": np.zeros((3, 5), np.float32),
                               "tables.users.acc": np.zeros(3, np.float32)}, {"format": "embnic-tables", "layout": "ids"})
    r = _run("tables", "import", "-c", cfg_path, bad, "--into", tmp_path / "n")
    assert r.exit_code == 2 and "do not fit dim 8" in r.output
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{{{{{")
    r = _run("tables", "import", "-c", cfg_path, junk, "--into", tmp_path / "n")
    assert r.exit_code == 2 and "is not a complete safetensors file" in r.output


def test_files_read_back_with_the_safetensors_library(tmp_path):
    """Our numpy writer against the reference reader (skips where `safetensors` is not installed)."""
    st = pytest.importorskip("safetensors.numpy")
    t = {"embedding_bags.t0.weight": np.random.default_rng(0).standard_normal((7, 3)).astype(np.float32),
         "tables.u.ids": np.array([1, 2**64 - 1], np.uint64), "tables.u.half": np.ones((2, 2), np.float16)}
    p = tmp_path / "f.safetensors"
    save_safetensors(p, t, {"format": "embnic-tables"})
    got = st.load_file(str(p))
    assert sorted(got) == sorted(t) and all(np.array_equal(got[k], t[k]) and got[k].dtype == t[k].dtype for k in t)
    mine, meta = TIO.load_safetensors(p)
    assert meta == {"format": "embnic-tables"} and all(np.array_equal(mine[k], t[k]) for k in t)
    q = tmp_path / "g.safetensors"
    st.save_file(t, str(q), metadata={"format": "embnic-tables"})  # and the library's files through our reader
    assert all(np.array_equal(TIO.load_safetensors(q)[0][k], t[k]) for k in t)


def test_torchrec_layout_loads_into_torchrecs_own_collection(tmp_path):
    """The torchrec export is read by the safetensors package itself and accepted, strictly, by
    TorchRec's ``EmbeddingBagCollection.load_state_dict``; the loaded collection pools the
    trained rows (sum) exactly as the in-process reference does."""
    torch = pytest.importorskip("torch", reason="the embnic[torch] extra (scripts/install-deps.sh installs it)")
    st_torch = pytest.importorskip("safetensors.torch", reason="the embnic[torch] extra")
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

    tables = [t | {"name": f"t{t['id']}"} for t in __import__("test_server").TABLES if t.get("rows")]
    assert tables
    cfg_path = _write_cfg(tmp_path, tables)
    from embnic.client_lib.config import load_config

    cfg = load_config(str(cfg_path))
    ref = _train(cfg, tmp_path / "run", steps=4)
    out = tmp_path / "w.safetensors"
    r = _run("tables", "export", "-c", cfg_path, "--from", tmp_path / "run", "--out", out, "--layout", "torchrec")
    assert r.exit_code == 0, r.output
    sd = st_torch.load_file(str(out))
    ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                                            feature_names=[f"f{t.id}"]) for t in cfg.tables])
    missing, unexpected = ebc.load_state_dict(sd, strict=True)
    assert not missing and not unexpected
    # one bag per feature holding every updated id of its table: the pooled sum is the sum of the trained rows
    keys, lengths = [], []
    for t in cfg.tables:
        k = ref.state_dict()[t.id][0]
        keys.append(k.astype(np.int64))
        lengths.append(k.size)
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=[f"f{t.id}" for t in cfg.tables],
                                              values=torch.from_numpy(np.concatenate(keys)),
                                              lengths=torch.tensor(lengths, dtype=torch.int32))
    pooled = ebc(kjt)
    for t, k in zip(cfg.tables, keys):
        want = ref.state_dict()[t.id][1].astype(np.float64).sum(axis=0)
        np.testing.assert_allclose(pooled[f"f{t.id}"].detach().numpy()[0], want, rtol=1e-5, atol=1e-5)


def test_damaged_files_are_named_not_a_numpy_error(tmp_path):
    """A truncated tables file was 'Error: ValueError: buffer is smaller than requested size', exit 1;
    a damaged checkpoint under --from 'BadZipFile: ...' naming a scratch copy; --out in a missing
    directory 'FileNotFoundError'. Now: the file and what is wrong, exit 2 (the file argument) or 1 (DIR)."""
    cfg_path = _write_cfg(tmp_path, [{"id": 0, "rows": 1000, "dim": 4, "name": "small"},
                                     {"id": 1, "rows": 500, "dim": 8, "name": "big"}])
    src = tmp_path / "ck"
    for i in range(2):
        (src / f"shard-{i}").mkdir(parents=True)
    good = tmp_path / "t.safetensors"
    r = _run("tables", "export", "-c", cfg_path, "--from", src, "--out", good)
    assert r.exit_code == 0, r.output
    data = good.read_bytes()
    n = int.from_bytes(data[:8], "little")
    cuts = {5000: "ends at byte", 8 + n + 10: "ends at byte", 100: "header length says", 5: "5 bytes"}
    for size, why in cuts.items():
        cut = tmp_path / f"cut{size}.safetensors"
        cut.write_bytes(data[:size])
        r = _run("tables", "import", "-c", cfg_path, cut, "--into", tmp_path / f"n{size}")
        assert r.exit_code == 2, r.output
        assert f"{cut} is not a complete safetensors file (" in r.output and why in r.output, r.output
        assert "ValueError" not in r.output and len(r.output.strip().splitlines()) == 1
        assert not (tmp_path / f"n{size}").exists()
    # a header whose sizes do not match the shapes
    hdr = json.loads(data[8:8 + n])
    hdr["embedding_bags.big.weight"]["shape"] = [500, 9]
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    odd = tmp_path / "odd.safetensors"
    odd.write_bytes(len(h).to_bytes(8, "little") + h + data[8 + n:])
    r = _run("tables", "import", "-c", cfg_path, odd, "--into", tmp_path / "odd")
    assert r.exit_code == 2 and "embedding_bags.big.weight: 16000 bytes for shape (500, 9)" in r.output, r.output
    # --out in a directory that does not exist: usage
    r = _run("tables", "export", "-c", cfg_path, "--from", src, "--out", tmp_path / "nodir" / "x.safetensors")
    assert r.exit_code == 2 and f"folder {tmp_path / 'nodir'} does not exist" in r.output, r.output
    # a damaged checkpoint in --from: exit 1 naming the user's file (not a scratch copy)
    r = _run("tables", "import", "-c", cfg_path, good, "--into", tmp_path / "imp")
    assert r.exit_code == 0, r.output
    ck = sorted((tmp_path / "imp" / "shard-1").glob("ckpt-*.npz"))[0]
    whole = ck.read_bytes()
    for damaged, why in ((whole[:300], "not a complete .npz file"), (b"garbage\n", "not an .npz file")):
        ck.write_bytes(damaged)
        r = _run("tables", "export", "-c", cfg_path, "--from", tmp_path / "imp", "--out", tmp_path / "o.safetensors")
        assert r.exit_code == 1, r.output
        assert f"Error: {ck}: unreadable checkpoint ({why}" in r.output, r.output
        assert "BadZipFile" not in r.output and "pickled" not in r.output
