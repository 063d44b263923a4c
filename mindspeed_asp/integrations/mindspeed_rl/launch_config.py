"""The launch line's Hydra overrides, composed once into the config file every process reads.

MindSpeed-RL's entry applies Hydra overrides (`rl_config.n_samples_per_prompt=16`, `asp.max_lag=2`) to the
config it trains with, but ASP reads its settings and the batch shape in every Ray process from the file
named by `ASP_MSRL_CONFIG`, and a file knows nothing of the launch line: the TransferDock would be sized for
one n and filled for another (a hang), and an `asp.*` override would be silently ignored. So the launcher
composes the overrides here, with Hydra's own compose API on the same search path, into one file without a
defaults list, and then points both MindSpeed-RL (`--config-path/--config-name`) and `ASP_MSRL_CONFIG` at
it: both read the same composed values, by construction. Overrides of Hydra itself (`hydra.*`, `hydra/...`)
stay on the launch line, where they configure Hydra's run directory and logging.

The same process then reads the composed file once, with the project's strict reader, validates it
(`config_section.topology_from_dict`) and prints the few shell variables the scripts themselves read
(`config_section.SHELL_VARS`); every other setting reaches each process through the file.

`check_launch_agrees` is the second line of defence, in the driver: a run launched without the scripts
(overrides typed after `train_grpo.py` by hand) is refused when what MindSpeed-RL composed differs from the
file ASP read, naming each key.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from mindspeed_asp.config import YamlProblem, parse_yaml, read_yaml
from mindspeed_asp.errors import ConfigError, InputError

#: keys (dotted prefixes) of the training YAML that ASP reads itself, in every process, from the file
ASP_READ_KEYS: Tuple[str, ...] = (
    "asp", "rl_config", "generate_config", "model", "megatron_training.global_batch_size",
    "megatron_training.seed", "megatron_training.train_iters", "megatron_training.model",
    "megatron_training.tokenizer_name_or_path", "actor_config.expert_model_parallel_size",
)
#: (trainer attribute, YAML key): the batch shape, compared in the driver with what MindSpeed-RL built
SHAPE_KEYS: Tuple[Tuple[str, str], ...] = (
    ("global_batch_size", "megatron_training.global_batch_size"),
    ("n_samples_per_prompt", "rl_config.n_samples_per_prompt"),
)


def is_hydra_override(item: str) -> bool:
    """An override of Hydra itself (run dir, search path, logging groups): it stays on the launch line."""
    key = item.lstrip("+~").split("=", 1)[0]
    return key == "hydra" or key.startswith("hydra.") or key.startswith("hydra/")


def split_overrides(overrides: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(Hydra's own overrides, config overrides). An item without `=` (other than a `~key` deletion) is
    refused: it is not an override, and Hydra would say so only after the cluster started."""
    hydra_args, config_args = [], []
    for item in overrides:
        if "=" not in item and not item.startswith("~"):
            raise ConfigError(f"launch argument {item!r} is not a Hydra override (key=value, +key=value, "
                              f"++key=value or ~key)")
        (hydra_args if is_hydra_override(item) else config_args).append(item)
    return hydra_args, config_args


def search_path_override(msrl_root: str | Path) -> str:
    """The search path MindSpeed-RL's configs (the `model:` group of the defaults list) are found on."""
    return f"hydra.searchpath=[file://{Path(msrl_root).resolve() / 'configs'}]"


def compose(config_file: str | Path, msrl_root: str | Path, overrides: Sequence[str]) -> Dict[str, Any]:
    """`config_file` composed as MindSpeed-RL's `@hydra.main` composes it: its defaults list from the
    project's and MindSpeed-RL's config directories, then `overrides`; `${oc.env:...}` stays unresolved
    (each process resolves it, as Hydra does). ConfigError naming the file and Hydra's reason on failure."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    path = Path(config_file).resolve()
    if not path.is_file():
        raise ConfigError("no such config file", path=str(path))
    GlobalHydra.instance().clear()
    try:
        warnings.filterwarnings("ignore", message=".*Defaults list is missing `_self_`",
                                category=UserWarning)  # MindSpeed-RL's configs: its entry warns the same
        with initialize_config_dir(config_dir=str(path.parent), version_base=None):
            cfg = hydra_compose(config_name=path.stem,
                                overrides=[search_path_override(msrl_root), *overrides])
    except Exception as exc:  # Hydra's own error says which override and why
        raise ConfigError(f"composing the launch overrides {list(overrides)} failed: "
                          f"{type(exc).__name__}: {' '.join(str(exc).split())}", path=str(path)) from exc
    finally:
        GlobalHydra.instance().clear()
    data = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(data, dict)
    return data


def write_composed(config_file: str | Path, msrl_root: str | Path, overrides: Sequence[str],
                   out_dir: str | Path) -> Path:
    """Compose and write `<out_dir>/<config name>.yaml` (the file the launch then uses everywhere)."""
    return write_data(compose(config_file, msrl_root, overrides), config_file, overrides, out_dir)


def write_data(data: Dict[str, Any], config_file: str | Path, overrides: Sequence[str], out_dir: str | Path) -> Path:
    """Write a composed config as `<out_dir>/<config name>.yaml`, headed by where it came from."""
    import yaml
    out = Path(out_dir) / Path(config_file).name
    out.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# {Path(config_file).name} composed by the launcher with Hydra's compose API "
              f"(the defaults list merged"
              + (f"; overrides: {' '.join(overrides)}" if overrides else "; no overrides") + ").\n"
              "# MindSpeed-RL and every ASP process read this file: edit the source config, not this copy.\n")
    out.write_text(header + yaml.safe_dump(data, sort_keys=False))
    return out


def resume_overrides(composed: Mapping[str, Any] | str | Path, workdir: str | Path,
                     given: Sequence[str]) -> Tuple[List[str], int | None]:
    """The overrides that make a relaunch resume: when the composed config's `actor_config.save` (relative to
    `workdir`, where the entry runs) holds a checkpoint with ASP's state, load from it with finetune,
    no_load_optim and no_load_rng off, except for any of those keys the launch line set itself. ([], None) when
    there is nothing to resume or `asp.ignore_saved_state` is set. `composed`: the composed mapping, or its
    file (read with the strict reader)."""
    from mindspeed_asp.integrations.mindspeed_rl.resume_state import RESUME_OVERRIDES, resumable_iteration
    data = dict(composed) if isinstance(composed, Mapping) else read_yaml(composed)
    save = dig(data, "actor_config.save")
    if not save or dig(data, "asp.ignore_saved_state") is True:
        return [], None
    it = resumable_iteration(Path(workdir) / str(save))
    if it is None:
        return [], None
    set_by_user = {key for key, _ in entry_overrides(given)}
    extra = [o for o in (f"++actor_config.load={save}", *RESUME_OVERRIDES)
             if o.lstrip("+").split("=", 1)[0] not in set_by_user]
    return extra, it


def dig(data: Dict[str, Any], dotted: str) -> Any:
    """The value at a dotted key of a parsed config, None when absent (config_section's lookup)."""
    from mindspeed_asp.integrations.mindspeed_rl.config_section import _get
    return _get(data, dotted, "<config>", None)


def read_by_asp(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in ASP_READ_KEYS)


def entry_overrides(argv: Sequence[str]) -> List[Tuple[str, str]]:
    """(key, value) of the config overrides on an entry script's command line (options and Hydra's own
    overrides skipped; a `~key` deletion has the value None)."""
    out: List[Tuple[str, Any]] = []
    skip = False
    for item in argv:
        if skip:
            skip = False
            continue
        if item.startswith("-"):
            skip = "=" not in item and item in ("--config-path", "--config-name", "--config-dir", "-cp", "-cn",
                                                "-cd")
            continue
        if is_hydra_override(item) or ("=" not in item and not item.startswith("~")):
            continue
        key, _, value = item.lstrip("+~").partition("=")
        out.append((key, value if "=" in item else None))
    return out


def check_entry_overrides(argv: Sequence[str], file_data: Dict[str, Any], path: str) -> None:
    """Refuse overrides typed on the entry's command line (MindSpeed-RL composes them, ASP's file does not
    have them) of keys ASP reads, unless the file already holds the same value: the launcher composes the
    overrides into the file and passes none, so such an override means a launch by hand."""
    bad = []
    for key, value in entry_overrides(argv):
        if not read_by_asp(key):
            continue
        have = dig(file_data, key)
        want = None if value is None else _override_value(value) if value else value
        if value is None or want != have:
            bad.append(f"{key}={value if value is not None else '<deleted>'} (the file ASP reads has {have!r})")
    if bad:
        raise ConfigError("Hydra overrides on the entry's command line of keys ASP reads from the file would "
                          "reach MindSpeed-RL only: " + "; ".join(bad) + ". Pass them to a shell/ launcher (it "
                          "composes them into the file both read), or edit the config", path=path)


def _override_value(text: str) -> Any:
    """An override's value as YAML reads it (the strict reader); text that is no YAML stays text."""
    try:
        return parse_yaml(text)
    except YamlProblem:
        return text


def check_launch_agrees(trainer: Any, file_data: Dict[str, Any], path: str) -> None:
    """Refuse a run whose trainer (built from MindSpeed-RL's composed config) disagrees with the file ASP
    read on a batch-shape key: overrides given on the entry's command line instead of to a shell/ launcher."""
    bad = []
    for attr, key in SHAPE_KEYS:
        have, want = getattr(trainer, attr, None), dig(file_data, key)
        if have is not None and want is not None and int(have) != int(want):
            bad.append(f"{key}: MindSpeed-RL trains with {have}, the file ASP reads says {want}")
    if bad:
        raise ConfigError("MindSpeed-RL's composed config and ASP's disagree (" + "; ".join(bad) + "): Hydra "
                          "overrides reach only MindSpeed-RL when typed after the entry script; pass them to a "
                          "shell/ launcher, which composes them into the file both read", path=path)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mindspeed_asp.integrations.mindspeed_rl.launch_config",
                                 description="Compose a training YAML with launch-line Hydra overrides into the "
                                 "one file MindSpeed-RL and ASP both read, validate it, and print the shell "
                                 "variables the launch scripts read: ASP_COMPOSED_CONFIG, ASP_HYDRA_ARGS (Hydra's "
                                 "own overrides, kept for the launch line) and config_section.SHELL_VARS. Hydra "
                                 "overrides follow `--`.")
    ap.add_argument("config", help="the training YAML (configs/<name>.yaml)")
    ap.add_argument("out_dir", help="where the composed file goes (the run directory's config/)")
    ap.add_argument("--msrl-root", required=True, help="MindSpeed-RL checkout (its configs/ holds the model group; "
                    "relative load/save paths are relative to it, where the entry runs)")
    ap.add_argument("--resume", choices=("auto", "off"), default="auto",
                    help="auto: when actor_config.save holds a checkpoint with ASP's state, compose the resume "
                    "settings too (load from it, finetune/no_load_optim/no_load_rng false); off: as written")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    args.overrides = argv[cut + 1:]  # after `--`: Hydra overrides, passed as they are
    import shlex

    from mindspeed_asp.integrations.mindspeed_rl.config_section import load_topology, shell_vars
    try:
        hydra_args, config_args = split_overrides(args.overrides)
        data = compose(args.config, args.msrl_root, config_args)
        if args.resume == "auto":
            extra, resumed = resume_overrides(data, args.msrl_root, config_args)
            if extra:
                config_args = config_args + extra
                data = compose(args.config, args.msrl_root, config_args)
                print(f"[asp] resuming iteration {resumed}: composed {' '.join(extra)}", file=sys.stderr)
        out = write_data(data, args.config, config_args, args.out_dir)
        topo = load_topology(out)  # the file every process reads, as they read it: once, strictly
    except InputError as exc:  # a bad override or config (ConfigError), an unwritable output (OutputError)
        print(f"[asp] error: {exc}", file=sys.stderr)
        return 2
    print(f"ASP_COMPOSED_CONFIG={shlex.quote(str(out))}")
    print("ASP_HYDRA_ARGS=(" + " ".join(shlex.quote(a) for a in hydra_args) + ")")
    print(shell_vars(topo))
    return 0


if __name__ == "__main__":
    sys.exit(main())
