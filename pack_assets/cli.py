"""`pack-assets`: the command line. Thin: parses arguments, calls the core or Dagster, prints."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .core.labels import POLICIES
from .core.settings import AUDIT_SCOPES, DEFAULTS, OUTPUT_MODES, OVERLONG, Settings
from .runner.runenv import exit_without_teardown, process_start, pyarrow_without_pandas, relax_gc, resolve_dagster_home

DEMO_INPUT = Path("demo_data/shards")


class OutputError(Exception):
    """Standard output could not take the result (a full disk, a closed pipe): exit 120, as CPython does when
    its final flush fails, with one line on stderr instead of a traceback."""


def _out(text: str) -> None:
    try:
        print(text)
    except OSError as e:
        raise OutputError(f"could not write the result to standard output: {e}") from None


def _emit(args, payload: dict, human: str) -> None:
    _out(json.dumps(payload, indent=2, default=str) if args.json else human)


def _summary_text(s: dict) -> str:
    fill = f"{s['fill']:.2%}" if isinstance(s.get("fill"), float) else s.get("fill")
    verdict = s.get("verdict") or ("PASS" if s["violations"] == 0 else "FAIL")
    if verdict == "FAIL":
        verdict += f": {s['violations']} violation(s), see the report"
    elif verdict == "INCOMPLETE":
        waiting = s.get("shards_waiting") or []
        verdict += f": {len(waiting)} shard(s) in the input not counted: {', '.join(waiting[:10])}"
    return "\n".join([
        f"samples   {s['samples']} read from {s['shards']} shard(s) ({s['shard_runs']} scanned this run)",
        f"packed    {s['packed']} into {s['packs']} packs of {s['max_len']} tokens ({s['profile']})",
        f"fill      {fill}; lower bound {s['lower_bound']} packs ({s['packs_over_bound']} over)",
        f"dropped   {s['dropped']} (over max length)   rejected {s['rejected']} (with reasons)"
        + (f"   split {s['split']} (into {s['split_pieces']} pieces)" if s.get("split") else ""),
        *([f"blend     {s['epochs']} epoch(s), one output folder each: {', '.join(s['output_folders'])}"]
          if s.get("epochs") else []),
        f"audit     {verdict}" + (f" ({s['output_shards_trusted']} unchanged output shard(s) "
                                     + ("re-read by their file digest only)" if s.get("output_shards_hashed")
                                        else "not re-read)") if s.get("output_shards_trusted") else ""),
        f"outputs   {s['output_dir']} ({s['output_shards']} shards + .nv-meta, {s.get('output_shards_written')} "
        "written this run" + (", index mode: media stay in the input shards" if s.get("output_mode") == "index" else "")
        + ")",
        f"          {s['plan_file']}",
        f"          {s['audit_report']}",
        f"          {s['duckdb']}",
        f"dagster    {s['dagster_home']} (from {s['dagster_home_from']})",
        f"time      {s['seconds']} s ("
        + ", ".join(f"{k} {v} s" for k, v in s.get("stage_seconds", {}).items()) + ")",
        *([f"          the helper processes scanned and counted for {s['helpers_scan_count_seconds']} s from their "
           "start (beside dagster-load)"] if s.get("helpers_scan_count_seconds") is not None else []),
    ])


def _settings(args, **extra) -> Settings:
    """The run's settings, built once: flags, then the ``--config`` file's keys over them, then ``extra``. With
    ``--recipe``, a setting left at its default takes the recipe's value (`Settings.from_flat`)."""
    fields = {"input_dir": str(args.input), "work_dir": str(args.work), "output_dir": str(args.output),
              "max_len": args.max_len, "profile": args.profile, "model_dir": args.model_dir or "",
              "trust_remote_code": args.trust_remote_code, "chat_template_kwargs": args.chat_template_kwargs,
              "algorithm": args.algorithm, "seed": args.seed, "max_packs_per_shard": args.max_packs_per_shard,
              "incremental": args.incremental, "audit_scope": args.audit_scope, "output_mode": args.mode,
              "label_policy": args.label_policy, "check_samples": args.check_samples,
              "overlong": args.overlong, "split_context": args.split_context, "cp_size": args.cp_size,
              "tp_size": args.tp_size, "sequence_parallel": args.sequence_parallel,
              "sample_multiple": args.sample_multiple}
    if getattr(args, "recipe", None):
        fields = {k: v for k, v in fields.items() if k != "input_dir" and v is not None}
        fields["recipe"] = str(Path(args.recipe).resolve())
        _refuse_default_over_recipe(args, fields)
    elif args.max_len is None:
        raise ValueError("--max-len N is required with --input (see pack-assets run --help)")
    fields = {k: v for k, v in fields.items() if v is not None}  # a flag not given: the default
    if getattr(args, "config", None):
        fields.update(json.loads(Path(args.config).read_text()))
    fields.update(extra)
    return Settings.from_flat(fields)


# flags whose argparse default is None, so that a flag given with the default's value can be told apart
_RECIPE_FLAGS = {"max_len": "--max-len", "profile": "--profile", "algorithm": "--algorithm", "seed": "--seed",
                 "max_packs_per_shard": "--max-packs-per-shard", "audit_scope": "--audit-scope",
                 "output_mode": "--mode", "label_policy": "--label-policy", "overlong": "--overlong",
                 "split_context": "--split-context", "cp_size": "--cp-size", "tp_size": "--tp-size",
                 "sample_multiple": "--sample-multiple"}


def _refuse_default_over_recipe(args, fields: dict) -> None:
    """A flag equal to its default cannot override the recipe (settings travel as flat values, and there a
    default means "not set": `Settings.from_flat`); refuse it instead of silently using the recipe's value."""
    from .core.recipe import load

    recipe = load(fields["recipe"]).flat()
    for name, flag in _RECIPE_FLAGS.items():
        given = fields.get(name)
        if given is not None and given == DEFAULTS[name] and name in recipe and recipe[name] != given:
            raise ValueError(f"{flag} {given} is the default, which cannot override the recipe's {name}: "
                             f"{recipe[name]!r}; change it in {args.recipe}")


def _run(args, **extra) -> int:
    from .core.preflight import preflight, usable_folder
    from .runner.command import run

    settings = _settings(args, **extra)
    home, home_from = resolve_dagster_home(args.dagster_home)
    usable_folder(home, f"the Dagster home ({home_from})")
    shards = preflight(settings)  # every refusal of the folders and settings: before the lock, a write, a scan
    summary = run(settings, shards, home, command=args.command, force=args.force, jobs=args.jobs, started=args.started)
    summary.update(dagster_home=str(home), dagster_home_from=home_from)
    _emit(args, summary, _summary_text(summary))
    return verdict_exit(summary.get("verdict") or ("PASS" if summary["violations"] == 0 else "FAIL"))


def verdict_exit(verdict: str) -> int:
    """0 PASS, 1 FAIL (violations), 3 INCOMPLETE (shards of the input not counted: nothing is proven about them)."""
    return {"PASS": 0, "FAIL": 1}.get(verdict, 3)


def cmd_demo(args) -> int:
    from .core.demo import make_demo
    from .core.safety import check_paths

    check_paths(DEMO_INPUT, Path(args.work), Path(args.output))  # before the demo data is generated
    if not any(DEMO_INPUT.glob("*.tar")):
        print(f"generating the demo dataset in {DEMO_INPUT}/ ...", file=sys.stderr)
        make_demo(DEMO_INPUT)
    args.input = DEMO_INPUT
    return _run(args)


def cmd_run(args) -> int:
    return _run(args)


def cmd_count(args) -> int:
    from .core.counting.count import count_records
    from .core.counting.profiles import resolve_profile

    media_root = Path(args.media_root) if args.media_root else None
    profile = resolve_profile(args.profile, args.model_dir, args.trust_remote_code, args.chat_template_kwargs or "")
    rows = count_records(Path(args.input), media_root, profile)
    for r in rows:
        _out(json.dumps(r, ensure_ascii=False))
    code = 0 if all("error" not in r for r in rows) else 1
    if args.check:
        from .core.counting.drift import check_file

        report = check_file(Path(args.input), media_root, profile, rows, args.check)
        for d in report.differences:
            print(f"check FAILED {d.line()}", file=sys.stderr)
        print(report.summary(), file=sys.stderr)
        code = code or (0 if report.ok else 1)
    return code


def cmd_profiles(args) -> int:
    from .core.counting.profiles import FAMILIES

    if args.model_dir:
        return _profile_of_folder(args)
    rows = [f.as_dict() for f in FAMILIES]
    lines = [f"{r['family']:16} {r['rule']:9} {', '.join(r['model_types']) or '(any model_type)'}\n"
             f"{'':26} --model-dir needs: {'; '.join(r['model_dir_files'])}\n{'':26} {r['note']}" for r in rows]
    _emit(args, {"families": rows}, "\n".join(lines))
    return 0


def _profile_of_folder(args) -> int:
    """What `--model-dir` gets: its family and rule; for the processor rule, the processor built here (so a
    missing package or a remote-code refusal shows before a run)."""
    from .core.counting.profiles import profile_from_model_dir

    p = profile_from_model_dir(args.model_dir, args.trust_remote_code)
    row = {"profile": p.name, "family": p.family, "rule": p.rule, "fingerprint": p.fingerprint}
    if p.rule == "processor":
        from .core.counting.procount import ProcessorCounter

        c = ProcessorCounter(p)
        row.update(processor=type(c.processor).__name__, videos=c.video_status())
    _emit(args, row, "\n".join(f"{k:12} {v}" for k, v in row.items()))
    return 0


def _lengths_caps(args):
    from .core.binpack import Caps
    from .core.sweep import load_lengths

    k = args.pad_multiple
    return load_lengths(args.lengths) if args.lengths else None, Caps(max_samples=args.max_samples_per_pack), k


def _cp_padded(args, lengths):
    """The lengths as `run` packs them under context parallelism, each padded to the sub-sample multiple, and
    that multiple (1: none): the figures are then of padded lengths, as `run`'s ``fill_padded``."""
    from .core.cpad import padded, sample_multiple

    m = sample_multiple(args.cp_size or 1, args.tp_size or 1, bool(args.sequence_parallel), args.sample_multiple or 0)
    return (lengths, m) if m == 1 else (padded(lengths, m), m)


def cmd_plan(args) -> int:
    from .core.sweep import summarize

    lengths, caps, k = _lengths_caps(args)
    lengths, m = _cp_padded(args, lengths)
    s = summarize(lengths, args.max_len // k * k, args.algorithm, caps, args.seed)
    if m > 1:
        s["sample_multiple"] = m  # packs, bound and efficiency of the padded lengths
    assignment = s.pop("assignment")
    if args.out:
        import numpy as np

        np.save(args.out, assignment) if args.out.endswith(".npy") else Path(args.out).write_text(
            "\n".join(map(str, assignment.tolist())) + "\n")
        s["out"] = args.out
    _emit(args, s, "\n".join(f"{k:22} {v}" for k, v in s.items()))
    return 0


def cmd_simulate(args) -> int:
    import numpy as np

    from .core.binpack import ALGORITHMS
    from .core.sweep import simulate

    lengths, caps, k = _lengths_caps(args)
    if lengths is None:
        from .core import store

        with store.connect(Path(args.work), read_only=True) as con:
            lengths = np.asarray([r[0] for r in con.execute(
                "SELECT total_tokens FROM token_lengths WHERE status = 'ok'").fetchall()], dtype=np.int64)
    algorithms = args.algorithms.split(",") if args.algorithms else list(ALGORITHMS)
    max_lens = [int(x) // k * k for x in args.max_len.split(",")]
    lengths, m = _cp_padded(args, lengths)
    res = simulate(lengths, max_lens, algorithms, caps, args.seed, args.global_batch)
    if m > 1:
        res["sample_multiple"] = m
    if args.plots:
        from .core.report import plot_simulation

        res["plots"] = plot_simulation(lengths, res, Path(args.plots))
    text = "\n".join(f"{r['max_len']:>7} {r['algorithm']:>10} packs {r['packs']:>8} bound {r['lower_bound']:>8} "
                     f"fill {r['efficiency']:.4f} dropped {r['dropped']:>6} mean/pack {r['mean_samples_per_pack']:.2f} "
                     f"max/pack {r['max_samples_per_pack']}"
                     + (f" steps {r['steps_per_epoch']}" if "steps_per_epoch" in r else "")
                     for r in res["results"])
    _emit(args, res, text + f"\nrecommended max length: {res['recommended_max_len']}")
    return 0


def cmd_convert(args) -> int:
    from .core.convert import convert
    from .core.hfshapes import parse_columns

    res = convert([Path(p) for p in args.input], Path(args.output), [Path(p) for p in args.media_root or []],
                  samples_per_shard=args.samples_per_shard, max_shard_bytes=args.max_shard_bytes,
                  columns=parse_columns(args.columns))
    shapes = ", ".join(f"{name} {rows}" for name, rows in res["shapes"].items())
    refused = [f for f in res["files"] if f["refused"]]
    text = "\n".join([
        f"{res['converted']} of {res['records']} records -> {len(res['shards'])} shard(s) in {args.output}; "
        f"{res['rejected']} rejected" + (f", {len(refused)} file(s) refused" if refused else "")
        + (f"; reasons {res['reasons']}" if res["reasons"] else "") + f" (see {res['rejected_file']})",
        *([f"shapes: {shapes} (rows read as each)"] if shapes else []),
        *[f"dropped columns of {f['file']}: {', '.join(f['columns_dropped'])} (not in the records)"
          for f in res["files"] if f.get("columns_dropped")][:20],
        *(f"refused: {f['file']}: {f['refused']}" + (f" after {f['rows']} rows" if f["rows"] else "")
          + f": {f['refused_detail'][:300]}" for f in refused[:20]),
        *([f"... and {len(refused) - 20} more refused file(s)"] if len(refused) > 20 else [])])
    _emit(args, res, text)
    return 0 if res["converted"] else 1


def cmd_lookup(args) -> int:
    from .core import store
    from .core.lookup import lookup

    with store.connect(Path(args.work), read_only=True) as con:
        try:
            res = lookup(con, args.id)
        except KeyError as e:
            print(f"error: {e.args[0]}", file=sys.stderr)
            return 2
    _emit(args, res, json.dumps(res, indent=2, default=str))
    return 0


def cmd_verify(args) -> int:
    from .core.audit import run_audit
    from .core.safety import lock_wait, work_lock

    if not (Path(args.work) / "pack_assets.duckdb").is_file():
        raise FileNotFoundError(f"no pack_assets catalog in {args.work}: run `pack-assets run` first (or pass --work)")
    # it writes the report: wait for a run on this work folder to finish rather than read it half-written
    with work_lock(Path(args.work), "pack-assets verify", wait=lock_wait(),
                   log=lambda m: print(m, file=sys.stderr, flush=True)):
        result = run_audit(Path(args.work), Path(args.output), digests=False)  # every shard checked in full
    payload = {"ok": result.verdict == "PASS", "verdict": result.verdict, "shards_waiting": result.waiting,
               "violations": result.violations, "stats": result.stats, "report": str(result.report)}
    lines = [f"{'OK' if result.verdict == 'PASS' else result.verdict}: {result.stats['samples_read']} samples, "
             f"{result.stats['packs_read']} packs, {result.stats['media_members_checked']} media members re-hashed; "
             f"{len(result.violations)} violation(s)"]
    if result.waiting:
        lines.append(f"  {len(result.waiting)} shard(s) in the input not counted in the plan: "
                     f"{', '.join(result.waiting[:20])}")
    lines += [f"  {v['check']}: {v['detail']}" for v in result.violations]
    _emit(args, payload, "\n".join(lines))
    return verdict_exit(result.verdict)


def _algorithm(name: str) -> str:
    """--algorithm checked as it is parsed (the planner's own check): a typo is a usage error, not a late one."""
    from .core.binpack import check_algorithm

    try:
        check_algorithm(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return name


def _algorithm_help(default: str) -> str:
    from .core.binpack import ACCEPTED

    return f"packing algorithm: {', '.join(ACCEPTED)} (default: {default}; see docs/usage.md)"


def _common_run(p: argparse.ArgumentParser) -> None:
    """The options `run` and `demo` share; each default shown is the one the settings resource has too."""
    from .core.counting.profiles import BUILTIN_PROFILES

    d = DEFAULTS
    p.add_argument("--work", metavar="DIR", default=d["work_dir"],
                   help=f"work directory: manifest, token lengths, DuckDB, plan, report (default: {d['work_dir']})")
    p.add_argument("--output", metavar="DIR", default=d["output_dir"],
                   help=f"output directory for packed shards (default: {d['output_dir']})")
    p.add_argument("--profile", metavar="NAME",
                   help=f"model profile: {', '.join(BUILTIN_PROFILES)} (default: {d['profile']})")
    p.add_argument("--model-dir", metavar="DIR", help="a local HF checkpoint folder (overrides --profile)")
    _trust(p)
    _template_kwargs(p)
    p.add_argument("--algorithm", metavar="NAME", type=_algorithm, help=_algorithm_help(d["algorithm"]))
    p.add_argument("--seed", type=int, metavar="S", help=f"seed of the pack order shuffle (default: {d['seed']})")
    p.add_argument("--max-packs-per-shard", type=int, metavar="N",
                   help=f"packs per output shard, at most (default: {d['max_packs_per_shard']}; a shard is also cut "
                        f"at {d['target_shard_bytes'] >> 20} MiB of media)")
    p.add_argument("--dagster-home", metavar="DIR", help="Dagster instance directory (default: $DAGSTER_HOME if set, "
                   "else ./dagster_home); a dagster.yaml with the project's settings is written if it has none")
    p.add_argument("--force", action="store_true", help="rescan and recount every shard even if unchanged")
    p.add_argument("--incremental", action="store_true",
                   help="keep the previous plan's packs and output shards; new samples go into new ones")
    p.add_argument("--audit-scope", choices=AUDIT_SCOPES,
                   help="all: re-read every output shard (one unchanged since the last clean audit only to hash "
                        "it against the digest that audit recorded); changed: re-read only output shards new or "
                        "changed since the last clean audit (the others are trusted by size, mtime and content "
                        "fingerprint) "
                        f"(default: {d['audit_scope']})")
    p.add_argument("--mode", choices=OUTPUT_MODES,
                   help="copy: output shards hold the media (self-contained); index: they hold the conversations "
                        "and byte ranges into the input shards, read from there at training time (small output; "
                        "the inputs must stay in place). See docs/usage.md, 'Copy or index?' "
                        f"(default: {d['output_mode']})")
    p.add_argument("--check-samples", type=int, metavar="N",
                   help="the audit also recounts N samples per shard with the --model-dir folder's real "
                        "processor; each difference is a violation (drift guard; default 0: off)")
    p.add_argument("--label-policy", choices=POLICIES,
                   help="which tokens train, recorded in _meta for the reader: all assistant turns (all, the "
                        "default), last_turn, no_tool_results, no_earlier_reasoning (docs/training.md)")
    p.add_argument("--overlong", choices=OVERLONG,
                   help="a sample longer than --max-len: drop it (the default; a dropped row with its length) or "
                        "split a multi-turn one at assistant turns into pieces that fit (docs/usage.md)")
    p.add_argument("--split-context", type=int, metavar="TOKENS",
                   help="with --overlong split: tokens of earlier turns a piece may carry as context "
                        f"(default {d['split_context']})")
    _parallelism(p)
    p.add_argument("--jobs", type=int, default=0, metavar="N",
                   help=f"worker processes that scan and count shards side by side (default: one per core, "
                        f"{os.cpu_count()} here, at most one per shard that needs it)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")


def _parallelism(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("context parallelism (THD): each sub-sample padded as the trainer pads it, packs "
                             "planned on the padded lengths (docs/usage.md)")
    g.add_argument("--cp-size", type=int, metavar="N", help="context-parallel size: sub-samples padded to a "
                   "multiple of 2N (default: 1, none)")
    g.add_argument("--tp-size", type=int, metavar="N", help="tensor-parallel size, with --sequence-parallel: "
                   "the multiple times N (default: 1)")
    g.add_argument("--sequence-parallel", action="store_true", default=None,
                   help="the trainer uses sequence parallelism (Megatron: tp x 2cp, or tp without CP)")
    g.add_argument("--sample-multiple", type=int, metavar="M", help="pad each sub-sample to a multiple of M "
                   "instead (a multiple of what the sizes need, e.g. lcm(16, 2cp) for FP8; default: from the sizes)")


def _template_kwargs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chat-template-kwargs", metavar="JSON",
                   help='extra chat template variables, as apply_chat_template(..., **kwargs) takes them, e.g. '
                        '\'{"enable_thinking": false}\' (part of the profile: a change recounts)')


def _trust(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trust-remote-code", action="store_true", default=DEFAULTS["trust_remote_code"],
                   help="let transformers run a --model-dir's own processor code (folders whose configs have an "
                        "auto_map); refused without it")


def _caps(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-samples-per-pack", type=int, default=0, help="cap on samples per pack (0: none)")
    p.add_argument("--pad-multiple", type=int, default=1, help="pad each pack's length to a multiple of k")
    p.add_argument("--seed", type=int, default=0, help="seed of the mix and mixfill algorithms")


class _Parser(argparse.ArgumentParser):
    """A usage error is one line on stderr, exit 2, as every other refusal is (`--help` shows the usage)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="pack-assets", description="Offline sequence packing for multimodal training data.")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="generate the demo dataset if absent and run the whole pipeline through Dagster",
                       description=f"Generate the bundled demo dataset in {DEMO_INPUT}/ if absent, then run the "
                                   "whole pipeline on it through Dagster, as `run` does.")
    _common_run(p)
    p.add_argument("--max-len", type=int, metavar="N", default=DEFAULTS["max_len"],
                   help=f"tokens per pack (default: {DEFAULTS['max_len']})")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "run", help="the whole pipeline on a directory of WebDataset shards, through Dagster",
        usage="pack-assets run (--input DIR --max-len N | --recipe FILE) [options]",
        description="Scan the WebDataset shards of a folder in place, count every sample's tokens for the model, "
                    "plan packs, write the packed shards and audit them, as Dagster runs of the five assets "
                    "(manifest, token_lengths, pack_plan, packed_shards, audit_report). Prints where everything "
                    "went. Exit 0 PASS, 1 FAIL, 2 refused (bad folders or settings, before any scan), 3 INCOMPLETE.")
    need = p.add_argument_group("required: --input and --max-len, or --recipe")
    one = need.add_mutually_exclusive_group(required=True)
    one.add_argument("--input", metavar="DIR", help="directory holding *.tar shards (searched recursively)")
    one.add_argument("--recipe", metavar="FILE", help="instead of --input: a blend of datasets with repeats and "
                     "epochs (YAML, see docs/usage.md); its settings apply where a flag is not given")
    need.add_argument("--max-len", type=int, metavar="N",
                      help="tokens per pack (required with --input; with --recipe, the recipe's max_len)")
    p.add_argument("--config", metavar="FILE", help="JSON file of further settings by name (see docs/usage.md)")
    _common_run(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("count", help="token counts of ShareGPT/LLaVA/messages records, one JSON line each")
    p.add_argument("--input", required=True, help=".json (a list) or .jsonl file of records")
    p.add_argument("--media-root", help="folder that relative media paths are resolved against")
    p.add_argument("--profile", default=DEFAULTS["profile"])
    p.add_argument("--model-dir", help="a local HF checkpoint folder; a family without a fast rule is counted by "
                   "its own processor (see `pack-assets profiles`)")
    _trust(p)
    _template_kwargs(p)
    p.add_argument("--check", type=int, default=0, metavar="N",
                   help="recount the first N counted records with the --model-dir folder's real transformers "
                        "processor (images as load_image gives them); every difference is reported on stderr "
                        "and exits 1")
    p.set_defaults(func=cmd_count, json=True)

    p = sub.add_parser("profiles",
                       help="every supported model family, its counting rule and the files --model-dir needs")
    p.add_argument("--model-dir", help="instead: the rule this folder gets, its processor built here as a check")
    _trust(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_profiles)
    _planner_commands(sub)
    _tool_commands(sub)
    return ap


def _planner_commands(sub) -> None:
    p = sub.add_parser("plan", help="the planner on a list of lengths (.npy, or text with one integer a line)")
    p.add_argument("--lengths", required=True)
    p.add_argument("--max-len", type=int, required=True)
    p.add_argument("--algorithm", metavar="NAME", type=_algorithm, default="bfd", help=_algorithm_help("bfd"))
    _caps(p)
    _parallelism(p)
    p.add_argument("--out", help="write the pack index of every item (.npy or text; -1 = dropped)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("simulate", help="what-if sweep over max lengths and algorithms")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--lengths")
    src.add_argument("--work", help="use the token_lengths of a work directory")
    p.add_argument("--max-len", required=True, help="comma-separated capacities, e.g. 4096,8192,16384")
    p.add_argument("--algorithms", help="comma-separated (default: all)")
    p.add_argument("--global-batch", type=int, default=0, help="packs per optimizer step, for steps per epoch")
    p.add_argument("--plots", help="folder for the length histogram/CDF and fill-vs-max-length plots")
    _caps(p)
    _parallelism(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_simulate)


def _tool_commands(sub) -> None:
    p = sub.add_parser("convert", help="ShareGPT/LLaVA/messages JSON(L) + media folders, or Hugging Face Parquet/"
                       "Arrow tables with their images (files, Hub snapshot folders) -> WebDataset shards")
    p.add_argument("--input", required=True, nargs="+", help=".json (a list) or .jsonl files; .parquet / .arrow "
                   "files; folders of them (a Hub snapshot, a datasets save_to_disk folder)")
    p.add_argument("--columns", action="append", metavar="NAME=COLUMN[,NAME=COLUMN]",
                   help="tables: which column holds what, for a shape the detector does not know (NAME: messages, "
                   "prompt, completion, texts, user, assistant, conversations, images, image; repeatable)")
    p.add_argument("--media-root", action="append", help="folder relative media paths resolve against (repeatable; "
                   "default: the input file's folder)")
    p.add_argument("--output", required=True, help="directory for the shards")
    p.add_argument("--samples-per-shard", type=int, default=1000)
    p.add_argument("--max-shard-bytes", type=int, default=1 << 30)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("lookup", help="a sample id -> its pack and output shard; a pack id -> its sources")
    p.add_argument("id")
    p.add_argument("--work", default=DEFAULTS["work_dir"])
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_lookup)

    p = sub.add_parser("verify", help="re-read the outputs and check every invariant (non-zero exit on a violation)")
    p.add_argument("--work", default=DEFAULTS["work_dir"])
    p.add_argument("--output", default=DEFAULTS["output_dir"])
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_verify)


def error_line(e: BaseException) -> str:
    """The one line a refusal or a failed run prints (an OS error keeps the file it names)."""
    return "error: " + " ".join(str(e).split())


def main(argv: list[str] | None = None) -> int:
    # run as the command (argv from sys.argv): time counts from process start, interpreter and imports included
    started = process_start() if argv is None else time.perf_counter()
    if argv is None:
        relax_gc()
        pyarrow_without_pandas()
    args = build_parser().parse_args(argv)
    args.started = started
    try:
        code = args.func(args)
    except (OSError, ValueError, RuntimeError) as e:  # a refusal, or the machine's error (full disk, I/O, access)
        print(error_line(e), file=sys.stderr)
        code = 2
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        code = 120
    if argv is None:  # the command: done, no teardown (called from Python, main returns)
        exit_without_teardown(code or 0)
    return code


if __name__ == "__main__":
    sys.exit(main())
