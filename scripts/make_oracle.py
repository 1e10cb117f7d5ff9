"""Oracle token counts for the fast rules of InternVL, LLaVA-OneVision and Gemma 3, made once with each
model's real transformers processor and committed (tests/fixtures/oracle/<family>.json), so CI checks the
fast rules without torch (tests/test_families.py).

Not a runtime dependency and not run by the tests. The InternVL and LLaVA-OneVision processors need
torchvision, which the project venv cannot import, so this runs in a separate venv:

    python3.11 -m venv /tmp/tv
    /tmp/tv/bin/pip install torch==2.14.1 torchvision==0.29.1
    /tmp/tv/bin/pip install transformers==5.23.0 tokenizers==0.23.3 pillow==13.0.0 numpy==2.4.6 jinja2==3.1.6
    /tmp/tv/bin/python scripts/make_oracle.py --models /tmp/oracle-models

(``--models`` gets the three checkpoint folders the tests build from tests/fixtures/models: see
``materialize`` below; they are the same files.) A count is ``len(input_ids)`` of
``processor.apply_chat_template(messages, tokenize=True, return_dict=True)`` with real (blank) PIL images of
each size in the image parts: the processor's own image processor, text expansion and tokenizer.

Videos (InternVL, LLaVA-OneVision; tests/fixtures/oracle/<family>.videos.json): the video parts name real
video files, which the processor decodes itself with its default loader, torchcodec (it needs FFmpeg's shared
libraries: on Debian 12 ``apt-get install libavcodec59 libavformat59 libavutil57 libswscale6 libswresample4
libavfilter8 libavdevice59``), so the same venv also needs::

    /tmp/tv/bin/pip install torchcodec==0.17.0 av==18.1.0 imagesize==2.0.1
    /tmp/tv/bin/python scripts/make_oracle.py --models /tmp/oracle-models --videos-only --shared /work/shared

Each family is counted with each video processor setting in ``family_fixtures.VIDEO_CONFIGS`` (the folder as
is: every frame; and sampling by num_frames / fps). The videos: the small ones committed under
tests/fixtures/videos (``--make-videos`` wrote the generated ones with PyAV) and, with ``--shared``, a few
larger real clips from the shared fixtures that are not committed: for those the oracle keeps the container
metadata ``pack_assets.core.media.probe_video`` reads (what the fast rule counts from) next to the counts.
The committed video oracles were made with ``--shared`` (tests/test_family_videos.py expects those clips).

Rotated images (tests/fixtures/oracle/rotated.json, every family: InternVL, LLaVA-OneVision, Gemma 3, Qwen2.5-VL,
Qwen3-VL): each stored size of ``tests/exif_images.py`` in every EXIF orientation 1-8 (JPEG), and orientation 6
carried by a PNG eXIf chunk, PNG XMP, WebP EXIF and JPEG XMP, each given to the processor as the PIL image
transformers' ``load_image`` returns for the file (the orientation applied). Not the file path itself: with a
path, ``apply_chat_template`` decodes through torchcodec or torchvision where installed, and torchvision
applies JPEG and PNG EXIF orientations but not XMP or WebP ones. Made in the project venv (torch + torchvision installed
there
since issue 36), transformers 5.24.0:

    PYTHONPATH=. .venv/bin/python scripts/make_oracle.py --models /tmp/oracle-models --rotated

Gemma 3 with pan-and-scan (tests/fixtures/oracle/gemma3_pan_and_scan.json) needs no torch: the project venv
runs it alone (Gemma3Processor has a PIL backend):

    PYTHONPATH=. .venv/bin/python scripts/make_oracle.py --models /tmp/oracle-models --only gemma3_pan_and_scan

transformers 5.23's Gemma3Processor passes its own call defaults (do_pan_and_scan False, 256, 4, 1.2) over
the folder's preprocessor_config.json, so crops appear only when the call asks; each setting here is the
folder's file with do_pan_and_scan true (and the listed pan_and_scan_* values) AND the same values passed at
call time (``processor_kwargs``), as the fast rule reads such a folder (core/counting/profiles.py ``_pan_and_scan``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
from exif_images import oriented_image, rotated_cases  # noqa: E402
from family_fixtures import FAMILY_DIRS, QWEN_DIRS, VIDEO_CONFIGS, VIDEOS, materialize, qwen_folder, video_variant  # noqa: E402

# generated clips (committed): name -> (codec, width, height, fps, frames); odd sizes, 1 frame, NTSC rate, WebM
# (no frame count in its header: the probe counts packets)
GENERATED = {
    "g12_64x48_30fps.mp4": ("libx264", 64, 48, 30, 12),
    "g50_200x120_25fps.mp4": ("mpeg4", 200, 120, 25, 50),
    "g7_32x320_10fps.webm": ("libvpx", 32, 320, 10, 7),
    "g1_96x64_24fps.mp4": ("libx264", 96, 64, 24, 1),
    "g40_80x60_ntsc.mov": ("mpeg4", 80, 60, "30000/1001", 40),
}
# real clips in the shared fixtures, too big to commit (--shared): 243/146 frames at 25.0/23.976 fps (header)
# vs 25.10/24.14 (torchcodec, from the stream's content), a 29.92-fps AVI, a 3-fps 491-frame clip
SHARED = {"lf_1.mp4": "datasets/llama-factory/mllm_demo_data/1.mp4",
          "lf_3.mp4": "datasets/llama-factory/mllm_demo_data/3.mp4",
          "lf_2.avi": "datasets/llama-factory/mllm_demo_data/2.avi",
          "qwen3_v_TpB.mp4": "datasets/qwen3-vl-finetune-demo/videos/v_TpB_zMG3XBA.mp4"}


def sizes() -> list[tuple[int, int]]:
    """(width, height): 1x1, extreme aspect ratios, tile and crop boundaries (448, 384, 896 ± 1), random."""
    out = [(1, 1), (1, 2), (2, 1), (1, 4000), (4000, 1), (2, 4000), (4000, 2), (3, 1000), (1000, 3), (10, 10),
           (27, 29), (100, 20000), (20000, 100), (16384, 16384), (5000, 5000), (8000, 40), (40, 8000)]
    for edge in (448, 384, 896):
        for a in range(1, 7):
            for b in (1, 2, 3):
                for d in (-1, 0, 1):
                    out += [(edge * a + d, edge * b), (edge * b, edge * a + d)]
    rng = random.Random(18)
    out += [(rng.randint(1, 5000), rng.randint(1, 5000)) for _ in range(120)]
    out += [(rng.randint(1, 60), rng.randint(500, 6000)) for _ in range(15)]
    out += [(rng.randint(500, 6000), rng.randint(1, 60)) for _ in range(15)]
    seen: set = set()
    return [s for s in out if not (s in seen or seen.add(s))]


def samples() -> list[dict]:
    """Whole samples: system, multi-turn, several images, text before/after images, whitespace and "\\n\\n" next
    to images (Gemma 3 merges them), Unicode (NFD too), a record-level tools list."""
    t = lambda s: {"type": "text", "text": s}  # noqa: E731
    img = {"type": "image"}
    tools = [{"type": "function", "function": {
        "name": "lookup", "description": "Look a thing up.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]
    rng = random.Random(4)
    pick = lambda k: [[rng.randint(1, 4000), rng.randint(1, 4000)] for _ in range(k)]  # noqa: E731
    convs = [
        ([{"role": "system", "content": [t("You are terse.")]}, {"role": "user", "content": [img, t("\nWhat is it?")]},
          {"role": "assistant", "content": [t("A cat.")]}], [[640, 480]]),
        ([{"role": "user", "content": [img, img, img, t("Compare these three.")]},
          {"role": "assistant", "content": [t("First is red.\n\nSecond is blue.")]},
          {"role": "user", "content": [t("And the third?")]}, {"role": "assistant", "content": [t("Green.")]}],
         [[300, 200], [1920, 1080], [37, 1000]]),
        ([{"role": "user", "content": [t("Look:\n\n"), img, t("\n\nand this one"), img]},
          {"role": "assistant", "content": [t("  Both squares.  \n\n")]}], [[896, 896], [1, 1]]),
        ([{"role": "user", "content": [t("No image, just text:  spaces\n\n\n")]},
          {"role": "assistant", "content": [t("ok")]}], []),
        ([{"role": "system", "content": [t("Be brief.")]},
          {"role": "user", "content": [t("Ünïcödé ✓ 数据 🙂 — \"quotes\""), img]},
          {"role": "assistant", "content": [t("Cafe\u0301 nai\u0308ve")]},
          {"role": "user", "content": [img, t("again?")]},
          {"role": "assistant", "content": [t("Yes.\n")]}], [[4000, 1], [448, 449]]),
        ([{"role": "user", "content": [img, t("Describe.")]}, {"role": "assistant", "content": [t("A wide strip.")]}],
         [[4000, 2]]),
        ([{"role": "user", "content": [img, t("Describe.")]}, {"role": "assistant", "content": [t("Tall.")]}],
         [[5, 3999]]),
        ([{"role": "user", "content": [t("Weather in Paris?")]}, {"role": "assistant", "content": [t("Sunny.")]}], []),
    ]
    out = [{"messages": m, "image_sizes": s} for m, s in convs]
    out[-1]["tools"] = tools
    for k in range(12):  # random multi-turn samples with 0-4 images
        n = rng.randint(0, 4)
        words = "the a cat dog sat on mat red blue image shows large small tree house car , . ? \n".split(" ")
        text = lambda words=words: t(" ".join(rng.choice(words) for _ in range(rng.randint(1, 60))))  # noqa: E731
        msgs = [{"role": "system", "content": [t("You describe images.")]}] if k % 2 else []
        msgs += [{"role": "user", "content": [img] * n + [text()]}, {"role": "assistant", "content": [text()]},
                 {"role": "user", "content": [text()]}, {"role": "assistant", "content": [text()]}]
        out.append({"messages": msgs, "image_sizes": pick(n)})
    return out


def make_videos(out: Path) -> None:
    """Write the GENERATED clips (a moving gradient, deterministic) with PyAV."""
    from fractions import Fraction

    import av
    import numpy as np

    out.mkdir(parents=True, exist_ok=True)
    for name, (codec, w, h, fps, n) in GENERATED.items():
        with av.open(str(out / name), "w") as c:
            s = c.add_stream(codec, rate=Fraction(fps))
            s.width, s.height, s.pix_fmt = w, h, "yuv420p"
            yy, xx = np.mgrid[0:h, 0:w]
            for i in range(n):
                img = np.stack([(xx * 4 + i * 9) % 256, (yy * 4 + i * 5) % 256, (xx + yy + i * 3) % 256], -1)
                for p in s.encode(av.VideoFrame.from_ndarray(img.astype(np.uint8), format="rgb24")):
                    c.mux(p)
            for p in s.encode():
                c.mux(p)
        print("wrote", out / name)


def video_samples(names: list[str]) -> list[dict]:
    """Whole samples with videos: each clip alone, then system, multi-turn, tools, text glued to the video, an
    image and a video together, several images and a video, two videos of one length, two of different lengths."""
    t = lambda s: {"type": "text", "text": s}  # noqa: E731
    vid, img = {"type": "video"}, {"type": "image"}
    tools = [{"type": "function", "function": {
        "name": "seek", "description": "Seek to a time.",
        "parameters": {"type": "object", "properties": {"t": {"type": "number"}}}}}]
    out = [{"messages": [{"role": "user", "content": [vid, t("What happens?")]},
                         {"role": "assistant", "content": [t("Colors move.")]}], "videos": [n], "image_sizes": []}
           for n in names]
    a, b = "g12_64x48_30fps.mp4", "g50_200x120_25fps.mp4"
    whole = [
        ([{"role": "system", "content": [t("You watch clips.")]}, {"role": "user", "content": [vid, t("\nDescribe.")]},
          {"role": "assistant", "content": [t("A gradient.")]}, {"role": "user", "content": [t("Faster?")]},
          {"role": "assistant", "content": [t("No.\n")]}], [b], []),
        ([{"role": "user", "content": [t("clip"), vid, t("what?")]}, {"role": "assistant", "content": [t("Noise.")]}],
         [a], [], tools),
        ([{"role": "user", "content": [t("Look: "), img, t(" then "), vid, t(" same?")]},
          {"role": "assistant", "content": [t("Yes.")]}], [a], [[640, 480]]),
        ([{"role": "user", "content": [img, img, vid, t("Ünïcödé ✓ 数据 — Cafe\u0301")]},
          {"role": "assistant", "content": [t("Three.")]}], [b], [[300, 200], [1920, 1080]]),
        ([{"role": "user", "content": [vid, vid, t("Which is longer?")]},
          {"role": "assistant", "content": [t("Same.")]}], [a, a], []),
        ([{"role": "user", "content": [vid, t("First.")]}, {"role": "assistant", "content": [t("Ok.")]},
          {"role": "user", "content": [vid, t("Second.")]}, {"role": "assistant", "content": [t("Longer.")]}],
         [a, b], []),
    ]
    for w in whole:
        out.append({"messages": w[0], "videos": w[1], "image_sizes": w[2], **({"tools": w[3]} if len(w) > 3 else {})})
    return out


def count_video(proc, sample: dict, paths: dict[str, str]) -> int | str:
    from PIL import Image

    imgs, vids = iter(sample["image_sizes"]), iter(sample["videos"])
    msgs = [{**m, "content": [{**p, "image": Image.new("RGB", tuple(next(imgs)))} if p["type"] == "image" else
                              {**p, "video": paths[next(vids)]} if p["type"] == "video" else p for p in m["content"]]}
            for m in sample["messages"]]
    try:
        out = proc.apply_chat_template(msgs, tools=sample.get("tools"), tokenize=True, return_dict=True)
    except Exception as e:  # the processor's refusal is an oracle too
        return f"error: {type(e).__name__}: {str(e)[:160]}"
    return len(out["input_ids"][0])


def video_files(shared: str | None) -> dict[str, str]:
    files = {p.name: str(p) for p in sorted(VIDEOS.iterdir()) if p.suffix in (".mp4", ".webm", ".mov", ".avi")}
    if shared:
        files.update({name: str(Path(shared) / "fixtures" / rel) for name, rel in SHARED.items()})
    return files


def video_oracle(family: str, folder: Path, shared: str | None) -> dict:
    import torchcodec
    import transformers
    from torchcodec.decoders import VideoDecoder
    from transformers import AutoProcessor

    from pack_assets.core.media import probe_video

    files = video_files(shared)
    meta = {}
    for name, path in files.items():
        with open(path, "rb") as f:
            m = probe_video(f)
        tc = VideoDecoder(path, seek_mode="exact").metadata  # what the processor's loader reports
        meta[name] = {"probe": m, "torchcodec": {"num_frames": tc.num_frames, "average_fps": tc.average_fps},
                      "committed": name not in SHARED}
    names = list(files)
    configs = {}
    for config, cfg in VIDEO_CONFIGS[family].items():
        proc = AutoProcessor.from_pretrained(video_variant(folder, family, config), local_files_only=True)
        rows = []
        for s in video_samples(names):
            rows.append({**s, "input_ids": count_video(proc, s, files)})
            print(family, config, s["videos"], rows[-1]["input_ids"], flush=True)
        configs[config] = {"video_preprocessor_config": cfg, "video_processor": type(proc.video_processor).__name__,
                           "samples": rows}
    return {"family": family, "folder": FAMILY_DIRS[family],
            "made_with": {"transformers": transformers.__version__, "torchcodec": torchcodec.__version__},
            "how": "len(processor.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True)"
                   "['input_ids'][0]) with each video part naming the file (the processor decodes it), blank PIL "
                   "images (scripts/make_oracle.py)", "videos": meta, "configs": configs}


def pan_and_scan_sizes() -> list[tuple[int, int]]:
    """Gemma 3 crop boundaries (defaults 256 / 4 / 1.2), both orientations: the activation ratio (1.2 ± 1 px),
    the half-up rounding of the ratio (x.5 ± 1 px), the min crop size on the short side and on the crop width
    (255/256/257), the crop-count cap (ratios 4.5 to 40) and the floor(long / min_crop) cap."""
    out = []
    for short in (5, 100, 255, 256, 257, 300, 500, 833, 1000, 1024):
        for ratio in (1.2, 1.5, 2.5, 3.5, 4.5):
            long = round(short * ratio)
            out += [(long + d, short) for d in (-1, 0, 1)]
    out += [(2 * c + d, 600) for c in (255, 256, 257) for d in (-1, 0, 1)]  # two crops of ~min_crop width
    out += [(3 * c + d, 600) for c in (256,) for d in (-2, -1, 0, 1)]
    out += [(w, 256) for w in (767, 768, 769, 1023, 1024, 1025, 1279, 1280, 1281)]  # floor(w/256) limits
    out += [(r * 300, 300) for r in (5, 6, 10, 20, 40)] + [(1000, 1000), (1200, 1000), (1199, 1000), (1201, 1000)]
    out += [(h, w) for w, h in out]
    seen: set = set()
    return [s for s in out if not (s in seen or seen.add(s))]


# (name, preprocessor_config.json pan_and_scan_* values, sizes): null = Gemma3Processor's call default
PAN_AND_SCAN_SETTINGS = (
    ("defaults", {}, "all"),  # the Hub files: every pan_and_scan_* is null
    ("min_crop_300_max_3_ratio_2", {"pan_and_scan_min_crop_size": 300, "pan_and_scan_max_num_crops": 3,
                                    "pan_and_scan_min_ratio_to_activate": 2.0}, "boundaries"),
    ("min_crop_100_max_8_ratio_1", {"pan_and_scan_min_crop_size": 100, "pan_and_scan_max_num_crops": 8,
                                    "pan_and_scan_min_ratio_to_activate": 1.0}, "boundaries"),
)


def pan_and_scan_samples() -> list[dict]:
    """samples(), then the same conversations with sizes that get crops (text right next to cropped images)."""
    base = samples()
    rng = random.Random(5)
    cropped = [[1920, 1080], [1080, 1920], [3000, 600], [600, 3000], [2600, 1000], [1000, 1000], [900, 2700],
               [513, 300], [4000, 1000], [640, 480]]
    again = [{**s, "image_sizes": [rng.choice(cropped) for _ in s["image_sizes"]]} for s in base if s["image_sizes"]]
    return base + again


def count(proc, messages: list[dict], image_sizes: list, tools=None, call: dict | None = None):
    """len(input_ids); with ``call`` (processor kwargs) also the crops the image processor made (pixel_values
    holds each image and its crops)."""
    from PIL import Image

    it = iter(image_sizes)
    msgs = [{**m, "content": [{**p, "image": Image.new("RGB", tuple(next(it)))} if p["type"] == "image" else p
                              for p in m["content"]]} for m in messages]
    try:
        kw = {"processor_kwargs": dict(call)} if call else {}  # a fresh dict: apply_chat_template adds to it
        out = proc.apply_chat_template(msgs, tools=tools, tokenize=True, return_dict=True, **kw)
    except Exception as e:  # the processor's refusal is an oracle too
        return f"error: {type(e).__name__}"
    if call is None:
        return len(out["input_ids"][0])
    return len(out["input_ids"][0]), len(out.get("pixel_values", [])) - len(image_sizes)


def _pan_and_scan_oracle(models: Path, out: Path, one: list[dict]) -> None:
    import shutil

    import tokenizers
    import transformers
    from transformers import AutoProcessor

    src = materialize(models, ("gemma3",))["gemma3"]
    size_list, boundaries = sizes(), pan_and_scan_sizes()
    seen = set(size_list)
    size_list += [s for s in boundaries if s not in seen]
    settings = []
    for name, values, which in PAN_AND_SCAN_SETTINGS:
        folder = models / f"{FAMILY_DIRS['gemma3']}.pan-and-scan.{name}"
        if not folder.exists():
            shutil.copytree(src, folder)
        cfg = json.loads((folder / "preprocessor_config.json").read_text(encoding="utf-8"))
        cfg.update(do_pan_and_scan=True, **values)
        (folder / "preprocessor_config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
        proc = AutoProcessor.from_pretrained(folder, local_files_only=True)
        call = {"do_pan_and_scan": True, **values}
        rows = []
        for w, h in (size_list if which == "all" else boundaries):
            got = count(proc, one, [[w, h]], call=call)
            rows.append([w, h, *got] if isinstance(got, tuple) else [w, h, got, None])
        whole = []
        if which == "all":
            for s in pan_and_scan_samples():
                got = count(proc, s["messages"], s["image_sizes"], s.get("tools"), call=call)
                whole.append({**s, "input_ids": got[0] if isinstance(got, tuple) else got})
        settings.append({"name": name, "preprocessor_config": {"do_pan_and_scan": True, **values},
                         "processor_kwargs": call, "sizes": rows, "samples": whole})
        print(name, len(rows), "sizes,", len(whole), "samples,", len({r[3] for r in rows}), "crop counts")
    doc = {"family": "gemma3", "folder": FAMILY_DIRS["gemma3"],
           "made_with": {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                         "processor": type(proc).__name__, "image_processor": type(proc.image_processor).__name__},
           "how": "the folder's preprocessor_config.json with do_pan_and_scan true and the setting's values; "
                  "len(processor.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True, "
                  "processor_kwargs=<the same values>)['input_ids'][0]) with blank PIL images of each size; "
                  "crops = len(pixel_values) - images (scripts/make_oracle.py)",
           "single_image_messages": one, "settings": settings}
    path = out / "gemma3_pan_and_scan.json"
    path.write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print("->", path)


def rotated_oracle(models: Path, out: Path, one: list[dict]) -> None:
    """tests/fixtures/oracle/rotated.json: per family, each of ``rotated_cases()`` (a stored size, an EXIF or
    XMP orientation 1-8, a format) as ``one``'s image, given to the processor as a file, which it loads with
    ``load_image`` (EXIF applied)."""
    import tempfile

    import tokenizers
    import torch
    import transformers
    from transformers import AutoProcessor
    from transformers.image_utils import load_image

    dirs = {**materialize(models), **{f: qwen_folder(models, f) for f in QWEN_DIRS}}
    doc = {"made_with": {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                         "torch": torch.__version__},
           "how": "len(processor.apply_chat_template(messages, tokenize=True, return_dict=True)['input_ids'][0]) "
                  "with the image part the PIL image transformers' load_image returns for a file made by "
                  "tests/exif_images.oriented_image (scripts/make_oracle.py --rotated)",
           "single_image_messages": one, "families": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for family, folder in dirs.items():
            proc = AutoProcessor.from_pretrained(folder, local_files_only=True)
            rows = []
            for c in rotated_cases():
                path = Path(tmp) / f"{family}-{len(rows)}.{c['ext']}"
                path.write_bytes(oriented_image(c["format"], c["orientation"], *c["stored"], how=c["how"]))
                # a PIL image as load_image returns it: with a file path, apply_chat_template decodes through
                # torchcodec / torchvision where installed, and torchvision ignores XMP and WebP orientations
                img = load_image(str(path))
                msgs = [{**m, "content": [{**p, "image": img} if p["type"] == "image" else p for p in m["content"]]}
                        for m in one]
                out_ids = proc.apply_chat_template(msgs, tokenize=True, return_dict=True)["input_ids"][0]
                case = {k: c[k] for k in ("format", "how", "stored", "orientation")}
                rows.append({**case, "input_ids": len(out_ids)})
            doc["families"][family] = {"folder": folder.name, "processor": type(proc).__name__, "cases": rows}
            print(family, len(rows), "rotated cases")
    path = out / "rotated.json"
    path.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print("->", path)


def main() -> None:
    if sys.argv[1:2] == ["--make-videos"]:  # once, in any venv with PyAV: the committed generated clips
        make_videos(VIDEOS)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True, help="a scratch folder for the checkpoint folders")
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "oracle"))
    ap.add_argument("--only", nargs="*", help=f"some of {', '.join(FAMILY_DIRS)}, gemma3_pan_and_scan")
    ap.add_argument("--videos-only", action="store_true", help="only the video oracles (<family>.videos.json)")
    ap.add_argument("--shared", help="the shared fixtures folder: also count its larger real clips (not committed)")
    ap.add_argument("--rotated", action="store_true", help="only the rotated-image oracle (rotated.json), every family")
    a = ap.parse_args()
    one = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe this."}]},
           {"role": "assistant", "content": [{"type": "text", "text": "It is an image."}]}]
    if a.rotated:
        rotated_oracle(Path(a.models), Path(a.out), one)
        return
    if not a.videos_only and (not a.only or "gemma3_pan_and_scan" in a.only):
        _pan_and_scan_oracle(Path(a.models), Path(a.out), one)
    families = [f for f in FAMILY_DIRS if not a.only or f in a.only]
    if not families:
        return
    import tokenizers
    import torch  # the InternVL and LLaVA-OneVision processors need torchvision
    import torchvision
    import transformers
    from transformers import AutoProcessor

    dirs = materialize(Path(a.models), families)
    for family in ("internvl", "llava-onevision"):
        if family not in families:
            continue
        doc = video_oracle(family, dirs[family], a.shared)
        path = Path(a.out) / f"{family}.videos.json"
        path.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(family, "videos ->", path)
    if a.videos_only:
        return
    for family in families:
        proc = AutoProcessor.from_pretrained(dirs[family], local_files_only=True)
        size_counts = [[w, h, count(proc, one, [[w, h]])] for w, h in sizes()]
        whole = [{**s, "input_ids": count(proc, s["messages"], s["image_sizes"], s.get("tools"))} for s in samples()]
        doc = {"family": family, "folder": FAMILY_DIRS[family],
               "made_with": {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                             "torch": torch.__version__, "torchvision": torchvision.__version__,
                             "processor": type(proc).__name__, "image_processor": type(proc.image_processor).__name__},
               "how": "len(processor.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True)"
                      "['input_ids'][0]) with blank PIL images of each size (scripts/make_oracle.py)",
               "single_image_messages": one, "sizes": size_counts, "samples": whole}
        path = Path(a.out) / f"{family}.json"
        path.write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
        print(family, len(size_counts), "sizes,", len(whole), "samples ->", path)


if __name__ == "__main__":
    main()
