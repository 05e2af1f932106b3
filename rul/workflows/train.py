"""`rul train`: an ensemble, one run split over torchrun's processes, or one run, each tracked
in MLflow (rul.workflows.tracked), and `--resume`: which unfinished run of a config goes on.

The command's store is opened once (rul.tracking.store.open_store) and handed down.
"""

from collections.abc import Callable
from dataclasses import dataclass

from mlflow.tracking import MlflowClient

from rul.errors import ConfigError
from rul.plan import ResumeTarget, plan_run
from rul.tracking.run_checkpoints import RunCheckpoints, resume_command
from rul.tracking.run_names import config_digest
from rul.tracking.run_params import config_params
from rul.tracking.store import Store, open_store
from rul.tracking_uri import absent_store, store_uri
from rul.training.distributed import World, process_group
from rul.training.run import train as train_plan
from rul.workflows.ensemble import train_ensemble
from rul.workflows.tracked import RunRole, track


@dataclass(frozen=True)
class Resume:
    """What `--resume` asks for: the run (None: the one unfinished run of the config), and
    whether it may go on with data files other than those it started with."""

    run_id: str | None = None
    new_data: bool = False

    @classmethod
    def of(cls, value: "bool | str | Resume") -> "Resume | None":
        """True: the newest; a run id; a Resume as it is; False or None: no resume."""
        if isinstance(value, Resume) or not value:
            return value or None
        return cls(None if value is True else value)


def train_tracked(config, resume: bool | str | Resume = False, jobs: int = 1,
                  progress: bool = True, subset=None,
                  on_run_created: Callable[[str], None] | None = None):
    """`rul train` as `config` says: an ensemble (ensemble > 1, `jobs` members at a time),
    else one run, split over the processes torchrun started (tracked by rank 0; the other
    ranks train their share and track nothing: (None, None)); return (outcome, run_id).
    `resume` (Resume.of): continue the one unfinished run of the config (True) or the run
    it names, on the files it started with unless it says new_data (then the run records
    both); `subset`: its files when already read; `on_run_created(run_id)` once the run
    exists."""
    resume = Resume.of(resume)
    world = World.from_env()
    if config.ensemble > 1:
        if world.distributed:
            raise ConfigError(f"ensemble={config.ensemble}: train an ensemble in one process "
                              "(not under torchrun)")
        if resume:
            raise ConfigError(f"--resume: an ensemble (ensemble={config.ensemble}) is not "
                              "resumable; run the command again to train it anew")
        return train_ensemble(config, jobs, progress, subset)
    if jobs > 1:
        raise ConfigError(f"--jobs {jobs}: a single model trains in one process (--jobs runs "
                          "an ensemble's members side by side; torchrun splits one training)")
    with process_group(world, config.device):
        if not world.is_main:  # trains its share; writes nothing, tracks nothing
            train_plan(plan_run(config, world=world, subset=subset), progress=False)
            return None, None
        store = target = None
        if resume:  # nothing to continue: said before a store is opened (or created)
            nothing_to_resume(config, resume.run_id)
            store = open_store(config, close_abandoned=False)  # track() closes them, all
            try:  # but the run it resumes
                target = resume_target(config, store, resume.run_id)
            except BaseException:  # nothing resumed: close every run a killed process left
                RunCheckpoints(config.checkpoint_dir).close_abandoned(MlflowClient(),
                                                                      store.experiment_id)
                raise
        plan = plan_run(config, target, subset=subset)  # a bad input opens no store, no run
        if target is not None:
            check_resumed_data(plan, resume.new_data)
        role = RunRole(register=config.register, on_run_created=on_run_created)
        return track(plan, role, store or open_store(config), progress=progress)


def nothing_to_resume(config, run_id: str | None) -> None:
    """FileNotFoundError when no checkpoint here could be resumed (RunCheckpoints.check_files),
    said without creating a store; an existing one is opened first, which closes the runs a
    killed process left RUNNING (one killed before its first checkpoint has none)."""
    try:
        RunCheckpoints(config.checkpoint_dir).check_files(run_id)
    except FileNotFoundError:
        if absent_store(store_uri(config.tracking_uri)) is None:
            open_store(config)
        raise


def resume_target(config, store: Store, run_id: str | None = None) -> ResumeTarget:
    """What `--resume` continues: run `run_id`, or the one unfinished run of `config` whose
    checkpoint exists and no live process holds (FileNotFoundError saying why not;
    CannotResume naming them all when there are several)."""
    checkpoints = RunCheckpoints(config.checkpoint_dir)
    client = MlflowClient()
    experiment_id = store.experiment_id
    try:
        found = checkpoints.resumable_run(client, experiment_id, config_digest(config), run_id)
    except FileNotFoundError as error:
        changed = _changed_keys(client, checkpoints, experiment_id, config, run_id)
        raise FileNotFoundError(f"{error}; {changed}" if changed else str(error)) from None
    return ResumeTarget(checkpoints.path(found), found)


def _changed_keys(client, checkpoints: RunCheckpoints, experiment_id: str, config,
                  run_id: str | None) -> str | None:
    """What a config change did to `--resume`: the run it would have continued (`run_id`, or
    the newest unfinished run with a checkpoint) and the keys it trained otherwise."""
    if run_id is None:
        runs = client.search_runs([experiment_id], order_by=["attributes.start_time DESC"],
                                  filter_string="attributes.status != 'FINISHED'")
        run = next((r for r in runs if checkpoints.has_checkpoint(r.info.run_id)), None)
    else:
        run = client.get_run(run_id) if checkpoints.has_checkpoint(run_id) else None
    if run is None:
        return None
    now, then = config_params(config), run.data.params
    keys = [k for k in config.identity() if k in now and k in then and now[k] != then[k]
            and now[k] != "auto"]  # `auto` was resolved into the run's params
    if not keys:
        return None
    return (f"run {run.info.run_id} has a checkpoint but trained "
            f"{', '.join(f'{k}={then[k]} (this command: {now[k]})' for k in keys)}: resume it "
            f"with: {resume_command(run)}")


def check_resumed_data(plan, new_data: bool) -> None:
    """The files a resumed run trains on are those it started with (their SHA-256 against the
    run's `data.sha256.<role>` tags): ConfigError naming the file that changed, unless
    `new_data` says it is on purpose; then the run records the new digests beside the old
    (`data.sha256.<role>.resumed`) and the epoch they start at."""
    client = MlflowClient()
    run_id = plan.resume_run_id
    tags = client.get_run(run_id).data.tags
    now = plan.data.subset.file_digests()
    changed = {role: digest for role, digest in now.items()
               if tags.get(f"data.sha256.{role}", digest) != digest}
    if not changed:
        return
    files = plan.data.subset.files
    if not new_data:
        role, digest = next(iter(changed.items()))
        raise ConfigError(
            f"--resume: {files[role]} changed since run {run_id} started (SHA-256 "
            f"{tags[f'data.sha256.{role}'][:12]}... then, {digest[:12]}... now); continue "
            "on it on purpose with --new-data (the run records both), or start a new run "
            "without --resume")
    epoch = plan.resume["train_state"]["epoch"]
    for role, digest in changed.items():
        client.set_tag(run_id, f"data.sha256.{role}.resumed", digest)
    client.set_tag(run_id, "data.resumed", f"after epoch {epoch} on changed files: "
                                           + ", ".join(files[r].name for r in changed))
