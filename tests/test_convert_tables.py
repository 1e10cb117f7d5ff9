"""`convert` on Hugging Face tables: Parquet Hub snapshots and `datasets.save_to_disk` folders in the shapes of
The Cauldron / FineVision, LLaVA-OneVision-Data and TRL messages sets. Oracle: each row's JSON twin (the same
record as JSON + image files) counted by `pack-assets count`."""

from __future__ import annotations

import io
import json
import os
import tarfile
from importlib.util import find_spec
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import needs
from hub_tables import SCHEMAS, image, rows, write_parquet, write_twins
from PIL import Image

from pack_assets.cli import main
from pack_assets.core import shardsink, store, tables
from pack_assets.core.convert import convert
from pack_assets.core.counting.count import count_records
from pack_assets.core.counting.profiles import load_profile
from pack_assets.core.counting.token_lengths import run_token_lengths
from pack_assets.core.hfshapes import detect, parse_columns
from pack_assets.core.reasons import ReasonError
from pack_assets.core.scan import run_manifest
from pack_assets.core.shardsink import ShardSink
from pack_assets.core.tables import TableReader, batch_rows_for, find_sources

SHAPES = {"cauldron": "the_cauldron/ai2d", "finevision": "FineVision/ai2d_merged",
          "llava": "LLaVA-OneVision-Data/CLEVR-Math(MathV360K)", "messages": "llava-instruct-mix-vsft/data"}
DETECTED = {"cauldron": "cauldron", "finevision": "cauldron", "llava": "llava", "messages": "messages"}


def _snapshot(root: Path, n: int = 40) -> dict[str, list[dict]]:
    """One Hub-like snapshot folder per dataset, each ``n`` rows over two files (``train-0000N-of-00002``)."""
    made = {}
    for shape, folder in SHAPES.items():
        made[shape] = rows(shape, n, seed=100 * len(made))
        for i in range(2):
            write_parquet(root / folder / f"train-{i:05d}-of-00002.parquet", shape,
                          made[shape][i * n // 2:(i + 1) * n // 2])
    return made


def _samples(shards: list[str]) -> dict[tuple[str, int], tuple[str, dict]]:
    """(origin file, index) -> (sample id, record) of every converted sample."""
    out = {}
    for shard in shards:
        with tarfile.open(shard) as tf:
            for m in tf.getmembers():
                if m.name.endswith(".json"):
                    rec = json.loads(tf.extractfile(m).read())
                    out[(rec["origin"]["file"], rec["origin"]["index"])] = (f"{Path(shard).stem}/{m.name[:-5]}", rec)
    return out


def test_hub_shapes_pack_every_row_each_counted_as_its_json_twin(tmp_path, monkeypatch, capsys):
    made = _snapshot(tmp_path / "hub")
    inputs = [tmp_path / "hub" / f
              for f in ("the_cauldron", "FineVision", "LLaVA-OneVision-Data", "llava-instruct-mix-vsft")]
    assert main(["convert", "--input", *map(str, inputs), "--output", str(tmp_path / "shards"), "--json",
                 "--samples-per-shard", "50"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["records"], res["converted"], res["rejected"]) == (160, 160, 0)
    assert res["shapes"] == {"cauldron": 80, "llava": 40, "messages": 40}
    assert len(res["shards"]) == 4 and len(res["files"]) == 8 and not res["files_refused"]
    assert [f["shape"] for f in res["files"]] == ["cauldron"] * 4 + ["llava"] * 2 + ["messages"] * 2
    samples = _samples(res["shards"])

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dh"))
    work = tmp_path / "work"
    assert main(["run", "--input", str(tmp_path / "shards"), "--max-len", "16384", "--work", str(work), "--output",
                 str(tmp_path / "out"), "--dagster-home", str(tmp_path / "dh"), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert (s["samples"], s["packed"], s["rejected"], s["dropped"], s["violations"]) == (160, 160, 0, 0, 0)
    with store.connect(work, read_only=True) as con:
        total = dict(con.execute("SELECT sample_id, total_tokens FROM token_lengths").fetchall())
        packed = {r[0] for r in con.execute("SELECT sample_id FROM pack_members").fetchall()}
    for shape, folder in SHAPES.items():
        twin = write_twins(tmp_path / f"{shape}.jsonl", shape, made[shape], tmp_path / "media")
        counts = count_records(twin, tmp_path / "media", "qwen3-vl", None)
        assert not [c for c in counts if "error" in c]
        rel = folder.split("/", 1)[1] if "/" in folder else ""
        for i, c in enumerate(counts):
            f = f"{rel}/train-{i // 20:05d}-of-00002.parquet".lstrip("/")
            sid, rec = samples[(f, i % 20)]
            assert sid in packed
            assert total[sid] == c["total_tokens"], (shape, i, rec)


def test_the_json_twins_convert_through_the_json_path_with_the_same_counts(tmp_path):
    """The JSON(L) + media path keeps working on the same records, TRL's (kind-only image parts + an
    `images` list) included."""
    twins = [write_twins(tmp_path / f"{shape}.jsonl", shape, rows(shape, 6, seed=7), tmp_path / "media")
             for shape in SHAPES]
    res = convert(twins, tmp_path / "shards", [tmp_path / "media"])
    assert (res["converted"], res["rejected"]) == (24, 0) and {f["shape"] for f in res["files"]} == {"json"}
    work, prof = tmp_path / "work", load_profile("qwen3-vl")
    run_manifest(tmp_path / "shards", work, "shard-000000")
    run_token_lengths(work, "shard-000000", prof)
    counted = pq.read_table(store.token_dir(work, prof.name, "shard-000000") / "token_lengths.parquet").to_pylist()
    expected = [c["total_tokens"] for t in twins for c in count_records(t, tmp_path / "media", "qwen3-vl", None)]
    assert [c["total_tokens"] for c in sorted(counted, key=lambda c: c["sample_id"])] == expected


def test_the_record_names_members_by_the_bytes_format_and_keeps_the_row(tmp_path):
    write_parquet(tmp_path / "ov" / "train-00000-of-00001.parquet", "llava", rows("llava", 2, seed=1))
    write_parquet(tmp_path / "fv" / "train-00000-of-00001.parquet", "finevision", rows("finevision", 1, seed=2))
    res = convert([tmp_path / "ov", tmp_path / "fv"], tmp_path / "out")
    with tarfile.open(res["shards"][0]) as tf:
        names = tf.getnames()
        ov = json.loads(tf.extractfile("000000000.json").read())
        fv = json.loads(tf.extractfile("000000002.json").read())
        first = tf.extractfile(names[1]).read()
    src = rows("llava", 2, seed=1)[0]
    assert names[:3] == ["000000000.json", "000000000.img0.gif", "000000001.json"]  # image 3 is a GIF (seed 1)
    assert first == src["image"]["bytes"]  # the bytes unchanged, whatever `path` (src_1_0.bin) says
    assert ov == {"id": "ov-1", "conversations": src["conversations"], "data_source": "CLEVR-Math(MathV360K)",
                  "images": ["img0.gif"], "origin": {"file": "train-00000-of-00001.parquet", "index": 0}}
    assert fv["messages"][0]["content"][:2] == [{"type": "image"}, {"type": "image"}]  # images first, first user turn
    assert fv["source"] == "ai2d_merged" and fv["relevance_ratings"] == [4, 5, 4] and "texts" not in fv


def test_detect_reads_the_shape_from_the_columns_and_a_mapping():
    fv = SCHEMAS["finevision"].append(pa.field("image", pa.string())).append(pa.field("blob", pa.binary()))
    shape = detect(fv)
    assert (shape.name, shape.turns, shape.images, shape.single_image) == ("cauldron", "texts", "images", False)
    assert shape.dropped == ("image", "blob") and "relevance_ratings" in shape.keep and "source" in shape.keep
    assert detect(SCHEMAS["llava"]).images == "image" and detect(SCHEMAS["llava"]).single_image
    other = pa.schema([("dialog", pa.list_(pa.struct([("q", pa.string()), ("a", pa.string())]))),
                       ("photos", pa.list_(pa.binary()))])
    with pytest.raises(ReasonError, match="match no known shape"):
        detect(other)
    with pytest.raises(ReasonError, match="photos hold images the cauldron shape does not read.*images=photos"):
        detect(other, parse_columns(["texts=dialog,user=q", "assistant=a"]))  # the images would be lost
    with pytest.raises(ReasonError, match="images=pics: no such column"):
        detect(other, parse_columns(["texts=dialog,user=q", "assistant=a", "images=pics"]))
    typed = pa.schema([("prompt", pa.int64()), ("completion", pa.string())])  # not turns: no shape, never a crash
    with pytest.raises(ReasonError, match="match no known shape"):
        detect(typed)
    mapped = detect(other, parse_columns(["texts=dialog,user=q", "assistant=a", "images=photos"]))
    assert (mapped.name, mapped.turns, mapped.images, mapped.user, mapped.assistant) == (
        "cauldron",
        "dialog",
        "photos",
        "q",
        "a",
    )
    with pytest.raises(ValueError, match="NAME=COLUMN"):
        parse_columns(["pictures=photos"])


def _bad_rows(tmp: Path) -> list[dict]:
    ico = io.BytesIO()
    Image.new("RGB", (16, 16)).save(ico, format="ICO")
    (tmp / "t" / "on_disk.png").parent.mkdir(parents=True, exist_ok=True)
    (tmp / "t" / "on_disk.png").write_bytes(image(1)[0])
    good = {"bytes": image(0)[0], "path": None}
    return [
        {
            "images": [{"bytes": b"\xff\xd8\xff\xe0 not a jpeg at all", "path": "x.jpg"}],
            "texts": [{"user": "a", "assistant": "b"}],
        },
        {"images": [{"bytes": b"", "path": None}], "texts": [{"user": "a", "assistant": "b"}]},
        {"images": [{"bytes": b"definitely not an image", "path": None}], "texts": [{"user": "a", "assistant": "b"}]},
        {"images": [{"bytes": ico.getvalue(), "path": "i.ico"}], "texts": [{"user": "a", "assistant": "b"}]},
        {"images": [{"bytes": None, "path": "missing.png"}], "texts": [{"user": "a", "assistant": "b"}]},
        {"images": [{"bytes": None, "path": "https://example.org/a.png"}], "texts": [{"user": "a", "assistant": "b"}]},
        {"images": [good, None], "texts": [{"user": "a", "assistant": "b"}]},
        {"images": [good], "texts": []},
        {"images": [{"bytes": None, "path": "on_disk.png"}], "texts": [{"user": "a", "assistant": "b"}]},
        {"images": [good], "texts": [{"user": "ok", "assistant": "fine"}]},
    ]


def test_bad_rows_and_files_get_reasons_never_a_crash(tmp_path, capsys):
    schema = pa.schema(
        [
            ("images", pa.list_(SCHEMAS["cauldron"].field("images").type.value_type)),
            ("texts", pa.list_(pa.struct([("user", pa.string()), ("assistant", pa.string())]))),
        ]
    )
    pq.write_table(pa.Table.from_pylist(_bad_rows(tmp_path), schema=schema), tmp_path / "t" / "a.parquet")
    pq.write_table(pa.table({"question": ["q"], "answer": ["a"]}), tmp_path / "t" / "b_unknown.parquet")
    whole = write_parquet(tmp_path / "c.parquet", "cauldron", rows("cauldron", 30), row_group_size=5).read_bytes()
    (tmp_path / "t" / "c_damaged.parquet").write_bytes(whole[: len(whole) // 2])  # no footer: not readable
    (tmp_path / "t" / "d_text.parquet").write_bytes(b"PAR1 this is not parquet PAR1")
    inline = [{"role": "user", "content": [{"type": "image", "image": image(0)[0], "text": None}]}]
    pq.write_table(pa.table({"messages": [inline]}), tmp_path / "t" / "e_inline.parquet")  # images inside the parts
    assert main(["convert", "--input", str(tmp_path / "t"), "--output", str(tmp_path / "out"), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["records"], res["converted"], res["rejected"], res["files_refused"]) == (10, 2, 8, 4)
    assert res["reasons"] == {
        "bad_image": 3,
        "unsupported_media": 1,
        "missing_media": 2,
        "remote_media": 1,
        "no_conversation": 1,
        "unknown_shape": 2,
        "unreadable_file": 2,
    }
    rejected = [json.loads(x) for x in Path(res["rejected_file"]).read_text().splitlines()]
    assert [r["index"] for r in rejected if r["file"] == "a.parquet"] == list(range(8))
    assert all(r["detail"] for r in rejected)
    assert {f["file"]: f["refused"] for f in res["files"]} == {
        "a.parquet": "",
        "b_unknown.parquet": "unknown_shape",
        "c_damaged.parquet": "unreadable_file",
        "d_text.parquet": "unreadable_file",
        "e_inline.parquet": "unknown_shape",
    }
    # the unknown shape converts once its columns are named
    assert (
        main(
            [
                "convert",
                "--input",
                str(tmp_path / "t" / "b_unknown.parquet"),
                "--output",
                str(tmp_path / "o2"),
                "--columns",
                "prompt=question,completion=answer",
            ]
        )
        == 0
    )
    assert "prompt_completion 1" in capsys.readouterr().out


def test_truncated_images_lost_image_columns_odd_types_and_nan_are_reasons_or_strict_json(tmp_path, capsys):
    """What a Hub download really holds: an image cut short (the header reads, the data stops), images in a
    column no shape reads, a column of another type than the shape's, a float column with NaN. Each is a
    reason (the file or the row), the other rows and files convert, and the records are strict JSON."""
    noisy = io.BytesIO()
    Image.frombytes("RGB", (96, 64), bytes(range(256)) * 72).save(noisy, format="JPEG")
    jpg, webp = noisy.getvalue(), image(2)[0]
    assert jpg[:3] == b"\xff\xd8\xff" and webp[8:12] == b"WEBP"
    texts = [{"user": "q", "assistant": "a"}]
    good = [{"bytes": jpg, "path": None}]
    t = tmp_path / "t"
    write = lambda name, table: (t.mkdir(exist_ok=True), pq.write_table(table, t / name))  # noqa: E731
    write(
        "a.parquet",
        pa.Table.from_pylist(
            [
                {"images": [{"bytes": jpg[: len(jpg) * 2 // 3], "path": None}], "texts": texts, "score": 1.0},
                {"images": [{"bytes": webp[:-10], "path": None}], "texts": texts, "score": 2.0},
                {"images": good, "texts": texts, "score": float("nan")},
            ],
            schema=pa.schema(
                [
                    ("images", SCHEMAS["cauldron"].field("images").type),
                    ("texts", SCHEMAS["cauldron"].field("texts").type),
                    ("score", pa.float64()),
                ]
            ),
        ),
    )
    write(
        "b_image_data.parquet",
        pa.Table.from_pylist(
            [{"image_data": good, "texts": texts}],
            schema=pa.schema(
                [
                    ("image_data", SCHEMAS["cauldron"].field("images").type),
                    ("texts", SCHEMAS["cauldron"].field("texts").type),
                ]
            ),
        ),
    )
    write("c_typed.parquet", pa.table({"prompt": [1, 2], "completion": ["x", "y"]}))
    assert main(["convert", "--input", str(t), "--output", str(tmp_path / "out"), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["records"], res["converted"], res["reasons"]) == (3, 1, {"bad_image": 2, "unknown_shape": 2})
    refused = {f["file"]: f["refused"] for f in res["files"]}
    assert refused == {"a.parquet": "", "b_image_data.parquet": "unknown_shape", "c_typed.parquet": "unknown_shape"}
    details = [json.loads(x)["detail"] for x in Path(res["rejected_file"]).read_text().splitlines()]
    assert any("jpg has no end marker" in d for d in details) and any("webp is truncated" in d for d in details)
    assert any("--columns images=image_data" in d for d in details)

    def strict(c):
        raise ValueError(f"not standard JSON: {c}")

    with tarfile.open(res["shards"][0]) as tf:
        rec = json.loads(tf.extractfile("000000002.json").read(), parse_constant=strict)
    assert rec["score"] is None
    # named, the images convert; a mapping to a column the table lacks is refused, naming it
    def with_columns(out: str, mapping: str) -> int:
        return main(["convert", "--input", str(t / "b_image_data.parquet"), "--output", str(tmp_path / out),
                     "--json", "--columns", mapping])

    assert with_columns("o2", "images=image_data") == 0
    assert json.loads(capsys.readouterr().out)["converted"] == 1
    assert with_columns("o3", "images=imagedata") == 1
    assert "images=imagedata: no such column" in Path(tmp_path / "o3" / "convert_rejected.jsonl").read_text()


def test_inputs_that_are_not_tables_or_records_get_a_clear_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.md").write_text("a dataset card")
    assert main(["convert", "--input", str(tmp_path / "empty"), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "no .parquet or .arrow file" in err and "Traceback" not in err
    assert main(["convert", "--input", str(tmp_path / "nope.parquet"), "--output", str(tmp_path / "o")]) == 2
    assert (
        main(["convert", "--input", str(tmp_path / "empty"), "--output", str(tmp_path / "o"), "--columns", "pix=img"])
        == 2
    )
    assert "NAME=COLUMN" in capsys.readouterr().err


def test_rows_stream_in_batches_and_the_output_is_the_same_with_or_without_threads(tmp_path):
    src = write_parquet(tmp_path / "s" / "train.parquet", "cauldron", rows("cauldron", 40), row_group_size=20)
    with TableReader(find_sources(src)[0], batch_rows=8) as reader:
        sizes = [b.num_rows for b in reader.batches()]
    assert sizes == [8] * 5 and reader.rows == 40  # a row group of 20 is read 8 rows at a time (pages, not the group)
    a = convert([tmp_path / "s"], tmp_path / "a", samples_per_shard=7, background=True, read_ahead=2)
    b = convert([tmp_path / "s"], tmp_path / "b", samples_per_shard=7, background=False, read_ahead=0)
    assert [Path(p).name for p in a["shards"]] == [f"shard-{i:06d}.tar" for i in range(6)]
    assert [Path(p).read_bytes() for p in a["shards"]] == [Path(p).read_bytes() for p in b["shards"]]
    with tarfile.open(a["shards"][0]) as tf:  # a plain tar reader reads what the sink wrote
        assert len([m for m in tf.getmembers() if m.name.endswith(".json")]) == 7


def test_a_write_error_in_the_writer_thread_reaches_the_caller_and_leaves_no_partial_shard(tmp_path):
    with pytest.raises(TypeError), ShardSink(tmp_path, background=True) as sink:
        sink.add([("0.json", b"{}")])
        sink.add([("1.json", "text where bytes belong")])  # fails on the writer thread, raised at close
    assert list(tmp_path.iterdir()) == []


@needs(find_spec("datasets") is None, "the `datasets` package is not installed (pip install 'pack_assets[hf]')")
def test_save_to_disk_folders_and_datasets_parquet_give_the_same_samples(tmp_path):
    import datasets

    features = datasets.Features(
        {
            "images": datasets.Sequence(datasets.Image()),
            "texts": [
                {
                    "user": datasets.Value("string"),
                    "assistant": datasets.Value("string"),
                    "source": datasets.Value("string"),
                }
            ],
        }
    )
    table = rows("cauldron", 12)
    ds = datasets.Dataset.from_list(table, features=features)
    ds.save_to_disk(str(tmp_path / "one"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(3))}).save_to_disk(str(tmp_path / "dict"))
    (tmp_path / "pq").mkdir()
    ds.to_parquet(str(tmp_path / "pq" / "train-00000-of-00001.parquet"))
    out = {k: convert([tmp_path / k], tmp_path / f"out_{k}") for k in ("one", "dict", "pq")}
    assert out["one"]["shapes"] == out["pq"]["shapes"] == {"cauldron": 12} and out["dict"]["shapes"] == {"cauldron": 15}
    assert [f["file"] for f in out["dict"]["files"]] == [
        "test/data-00000-of-00001.arrow",
        "train/data-00000-of-00001.arrow",
    ]
    media = {
        k: [
            (n, tf.extractfile(n).read())
            for tf in [tarfile.open(v["shards"][0])]
            for n in tf.getnames()
            if not n.endswith(".json")
        ]
        for k, v in out.items()
    }
    assert media["one"] == media["pq"] and len(media["one"]) == sum(len(r["images"]) for r in table)


def test_a_damaged_page_keeps_the_rows_read_before_it(tmp_path):
    p = write_parquet(tmp_path / "d" / "train.parquet", "cauldron", rows("cauldron", 30), row_group_size=5)
    at = pq.ParquetFile(p).metadata.row_group(3).column(0).data_page_offset
    data = bytearray(p.read_bytes())
    data[at : at + 32] = b"\xff" * 32  # row group 3's first page header no longer parses
    p.write_bytes(bytes(data))
    res = convert([p.parent], tmp_path / "out", batch_rows=5)
    assert (res["records"], res["converted"], res["reasons"]) == (15, 15, {"unreadable_file": 1})
    assert res["files"][0]["refused"] == "unreadable_file"
    assert "after 15 rows" in Path(res["rejected_file"]).read_text()


def test_batches_hold_about_the_same_bytes_whatever_the_row_size(tmp_path, monkeypatch):
    big = tmp_path / "big.parquet"  # rows of ~20 KB: a few a batch
    pq.write_table(pa.table({"b": [bytes([i]) * 20_000 for i in range(40)]}), big, row_group_size=10,
                   compression="none")
    small = tmp_path / "small.parquet"  # short text rows: many a batch, up to the cap
    pq.write_table(pa.table({"t": [f"row {i}" for i in range(9000)]}), small)
    assert batch_rows_for(pq.ParquetFile(big).metadata, 110_000) == 5
    assert batch_rows_for(pq.ParquetFile(small).metadata, 110_000) == 4096
    monkeypatch.setattr(tables, "_BATCH_BYTES", 110_000)
    with TableReader(find_sources(big)[0]) as reader:
        assert [b.num_rows for b in reader.batches()] == [5] * 8
    unsized = SimpleNamespace(num_rows=10, total_byte_size=0, num_columns=1,
                              column=lambda i: SimpleNamespace(total_compressed_size=0))
    meta = SimpleNamespace(num_row_groups=2, row_group=lambda i: unsized)  # a writer that states no sizes
    assert batch_rows_for(meta, 110_000) == 64


def test_the_sink_writes_the_same_bytes_in_runs_of_any_size_and_members_past_iov_max(tmp_path, monkeypatch):
    samples = [[(f"{k:04d}.json", b"{}" * k)] + [(f"{k:04d}.m{j}.bin", memoryview(bytes([j % 256]) * (k + j)))
                                                 for j in range(400 if k == 3 else 2)] for k in range(9)]
    out = {}
    write = os.write

    def short_writev(fd, bufs):  # the kernel may write less than asked (a signal, a disk filling up)
        return write(fd, bytes(bufs[0])[: max(1, len(bufs[0]) // 2)])

    for label, run_bytes, background in (("one", 1, True), ("big", 1 << 30, True), ("inline", 50, False),
                                         ("short", 300, True)):
        monkeypatch.setattr(shardsink, "_RUN_BYTES", run_bytes)
        if label == "short":
            monkeypatch.setattr(os, "writev", short_writev)
        with ShardSink(tmp_path / label, samples_per_shard=4, background=background) as sink:
            for members in samples:
                sink.add(members)
        out[label] = [Path(p).read_bytes() for p in sink.shards]
    assert out["one"] == out["big"] == out["inline"] == out["short"] and len(out["one"]) == 3
    with tarfile.open(tmp_path / "one" / "shard-000000.tar") as tf:  # the 400-member sample (1,203 buffers)
        names = tf.getnames()
        assert len(names) == 3 + 3 + 3 + 401 and tf.extractfile("0003.m399.bin").read() == bytes([399 % 256]) * 402

