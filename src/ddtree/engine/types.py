"""Requests and per-request records exchanged between the engine, the server and the benchmarks."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# The one list of decoding methods and of a round's timed stages; everything else reads these.
METHODS = ("ar", "dflash", "ddtree")
STAGES = ("draft", "tree_build", "tree_compile", "verify", "commit")
# The one code default for a request's length (SGLang's /generate default): the engine, the server, the benchmark
# clients, their command lines and the benchmark plan read it. Experiment configs set their own (config/config.yaml).
DEFAULT_MAX_NEW_TOKENS = 128


@dataclass
class GenerationRequest:
    input_ids: list[int]
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.0  # 0 = greedy
    top_k: int = -1  # <= 0: no top-k
    top_p: float = 1.0  # in (0, 1]
    stop_token_ids: list[int] = field(default_factory=list)
    stop_strings: list[str] = field(default_factory=list)
    seed: int | None = None


@dataclass
class GenerationOutput:
    output_ids: list[int]
    finish_reason: str  # "length" | "stop"
    rounds: int  # verify rounds (for "ar": decode steps)
    accept_lens: list[int]  # per round, accepted draft tokens (bonus excluded)
    expected_accept_lens: list[float]  # per round, exact expectation of accept_len
    stage_times: dict[str, float]  # seconds summed over rounds, keys = STAGES
    ttft: float  # seconds, prefill + first token
    decode_time: float  # seconds after the first token
    matched_stop: int | str | None = None  # the stop token id or stop string that ended it (SGLang's matched_stop)
    method: str = ""  # method that produced it
    budget: int = 0  # tree budget (ddtree), drafted chain length (dflash), 0 (ar)
    # per round (speculative methods), nats: entropy of the target's processed next-token distribution at the root
    entropies: list[float] = field(default_factory=list)

    @property
    def tau(self) -> float:
        """Mean tokens committed per round including the bonus."""
        return (sum(self.accept_lens) + len(self.accept_lens)) / max(len(self.accept_lens), 1)


@dataclass
class LoopStats:
    """Where a decoding loop's wall time goes, cumulative seconds: enqueueing each round's stages (`launch`),
    waiting for the device to finish them and reading the emitted tokens (`wait`), the host's bookkeeping after
    (stop rules, token callbacks, retiring finished rows: `post`), admissions (prefill and first token:
    `admit`), and, set by a scheduler, waiting for requests (`idle`). A server reports them (`/server_info`),
    so a throughput run can tell a loop the device paces (`wait` dominates) from one the host paces."""

    rounds: int = 0
    row_rounds: int = 0  # active rows summed over rounds
    admissions: int = 0
    launch_s: float = 0.0
    wait_s: float = 0.0
    post_s: float = 0.0
    admit_s: float = 0.0
    idle_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


STAGE_TIMES = ("auto", "on", "off")
STAGE_TIMES_HELP = ("time each round's stages (draft, tree build, tree compile, verify, commit); auto = on the CPU, "
                    "where it costs a clock read per stage, off on CUDA, where it synchronises the device after "
                    "each stage and turns off overlapped rounds")


def stage_times_on(choice: str, device: object) -> bool:
    """`--stage-times` (one of STAGE_TIMES) for an engine on `device` (a resolved device or its name: cpu, cuda,
    cuda:N), with auto resolved by the device type."""
    if choice not in STAGE_TIMES:
        raise ValueError(f"stage times must be one of {STAGE_TIMES}, got {choice!r}")
    if choice == "auto":
        return not str(device).startswith("cuda")
    return choice == "on"
