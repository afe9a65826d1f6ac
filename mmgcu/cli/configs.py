"""``mmgcu configs``: list the configs shipped with mmgcu, or print the path of one (for
``_base_``: :mod:`mmgcu.launch.configs` says why a config names mmgcu's base by its path)."""

import os.path as osp

from ..launch.configs import BASE, config_root, find_config, shipped_configs


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "configs",
        help="list the configs shipped with mmgcu, or print the path of one",
        description="List the configs shipped with mmgcu (the GCU base config and ready "
        "configs for 8 T20 cards), or print the absolute path of one, e.g. for _base_.",
    )
    parser.add_argument(
        "name", nargs="?", help=f"a shipped config (e.g. {BASE}); prints its absolute path"
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    root = config_root()
    if args.name:
        path = find_config(args.name, root)
        if path is None:
            print(f"mmgcu configs: no shipped config {args.name!r}; 'mmgcu configs' lists them")
            return 1
        print(path)
        return 0
    print("GCU base config: in _base_, in place of mmseg's default_runtime.py:")
    print(f"  {osp.join(root, BASE)}")
    print("configs for the 8 cards of a T20 server (mmgcu train NAME [CARDS] runs one):")
    for name in shipped_configs(root):
        print(f"  {name}")
    print(f"(in {root})")
    return 0
