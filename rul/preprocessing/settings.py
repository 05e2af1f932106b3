"""What preparing a training's data reads, as plain values the plan (rul.plan) takes from the
config: the data set, its split, the rows' preprocessing and the windows."""

from dataclasses import dataclass

from rul.files import SizeLimit


@dataclass(frozen=True)
class DataSettings:
    dataset: object  # the `data:` section or a C-MAPSS preset (rul.data.load_dataset reads it)
    own: bool  # a data set of one's own (a `data:` section), not a C-MAPSS subset
    data_dir: str | None
    limit: SizeLimit
    val_fraction: float
    late_start_max: int
    censored_training: str  # known | lower_bound | dropped (rul.preprocessing.censored)
    window: int
    rul_cap: int
    features: str | list  # 'informative', 'all' or sensor columns
    include_settings: bool
    include_cycle: bool
    drop_constant: bool
    normalization: str
    smoothing_alpha: float
    n_conditions: int | None  # None: counted on the training units
    strict_data: bool
    seed: int  # the run's seed: counting the operating conditions
