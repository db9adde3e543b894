"""Command line: ``python -m data_gen {criteo,criteo-tsv,sok,movielens,preprocess-criteo} ...``.

Examples::

    python -m data_gen criteo build/data/criteo --rows 2000000 --parts 2
    python -m data_gen criteo-tsv build/data/days --rows 600000 --files 3
    python -m data_gen preprocess-criteo build/data/days-parquet build/data/days/day_* --cross C1:C2
    python -m data_gen sok build/data/sok --samples 40960 --vocabulary-size 8192 --slot-num 100 --max-nnz 10
    python -m data_gen movielens build/data/ml --ratings 1000000
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m data_gen", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("out", help="output directory")
        sp.add_argument("--seed", type=int, default=0)
        sp.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
        sp.add_argument("--quiet", action="store_true", help="no progress bar")

    c = sub.add_parser("criteo", help="Criteo-like rows straight to a parquet dataset")
    common(c)
    c.add_argument("--rows", type=int, required=True)
    c.add_argument("--scale", type=float, default=0.01, help="fraction of Criteo's cardinalities")
    c.add_argument("--parts", type=int, default=1)
    c.add_argument("--reuse", action="store_true", help="keep an existing dataset with the same parameters")

    t = sub.add_parser("criteo-tsv", help="Criteo-like rows as Criteo-format day files")
    common(t)
    t.add_argument("--rows", type=int, required=True)
    t.add_argument("--files", type=int, default=1)
    t.add_argument("--scale", type=float, default=0.01)

    s = sub.add_parser("sok", help="SOK-style random samples to a parquet dataset")
    common(s)
    s.add_argument("--samples", type=int, required=True)
    s.add_argument("--vocabulary-size", type=int, default=8192)
    s.add_argument("--slot-num", type=int, default=100)
    s.add_argument("--max-nnz", type=int, default=10)
    s.add_argument("--use-sparse-mask", action="store_true")
    s.add_argument("--parts", type=int, default=1)

    m = sub.add_parser("movielens", help="MovieLens-like ratings in the ml-25m CSV layout")
    common(m)
    m.add_argument("--ratings", type=int, default=1_000_209)
    m.add_argument("--users", type=int, default=6040)
    m.add_argument("--movies", type=int, default=3706)

    pp = sub.add_parser("preprocess-criteo", help="Criteo TSV day files -> parquet + keysets")
    pp.add_argument("out")
    pp.add_argument("inputs", nargs="+")
    pp.add_argument("--min-count", type=int, default=10)
    pp.add_argument("--no-normalize", action="store_true")
    pp.add_argument("--cross", action="append", default=[], help="a feature cross like C1:C2 (repeatable)")
    pp.add_argument("--skip-bad-lines", action="store_true")
    pp.add_argument("--scheduler", default="local", help="'local', 'synchronous' or a Dask scheduler address")
    pp.add_argument("--overwrite", action="store_true")
    pp.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except (ValueError, TypeError, OSError) as exc:  # bad input: its message, not a traceback
        print(f"python -m data_gen {args.command}: error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    progress = not args.quiet
    if args.command == "criteo":
        from data_gen.criteo import scaled_cardinalities, write_criteo_parquet
        schema = write_criteo_parquet(args.out, args.rows, cardinalities=scaled_cardinalities(args.scale),
                                      seed=args.seed, num_parts=args.parts, overwrite=args.overwrite,
                                      reuse=args.reuse, progress=progress)
        result = {"rows": schema.num_rows, "oracle_auc": schema.metadata["oracle_auc"]}
    elif args.command == "criteo-tsv":
        from data_gen.criteo import scaled_cardinalities, write_criteo_tsv
        files = write_criteo_tsv(args.out, args.rows, num_files=args.files, seed=args.seed,
                                 cardinalities=scaled_cardinalities(args.scale), overwrite=args.overwrite,
                                 progress=progress)
        result = {"files": [str(f) for f in files]}
    elif args.command == "sok":
        from data_gen.sok_samples import write_random_samples
        schema = write_random_samples(args.out, args.samples, args.vocabulary_size, args.slot_num, args.max_nnz,
                                      use_sparse_mask=args.use_sparse_mask, seed=args.seed, num_parts=args.parts,
                                      overwrite=args.overwrite, progress=progress)
        result = {"rows": schema.num_rows, "oracle_auc": schema.metadata["oracle_auc"]}
    elif args.command == "movielens":
        from data_gen.movielens import write_movielens
        write_movielens(args.out, args.ratings, num_users=args.users, num_movies=args.movies, seed=args.seed,
                        overwrite=args.overwrite, progress=progress)
        result = {"out": args.out}
    else:
        from data_gen.criteo_tsv import preprocess_criteo
        crosses = [tuple(c.split(":")) for c in args.cross]
        schema = preprocess_criteo(args.inputs, args.out, min_count=args.min_count, normalize=not args.no_normalize,
                                   feature_crosses=crosses, scheduler=args.scheduler,
                                   on_bad_lines="skip" if args.skip_bad_lines else "error",
                                   overwrite=args.overwrite, progress=progress)
        result = {"rows": schema.num_rows, "bad_lines": schema.metadata["preprocessing"]["bad_lines"]}
    result["seconds"] = round(time.perf_counter() - start, 2)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
