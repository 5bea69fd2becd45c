"""The benchmark plan and the per-request records: typed, versioned, the schema of what crosses processes.

The workflow's plan job writes a `BenchPlan` (`write_plan`) that `ddtree bench session --plan` reads
(`read_plan`); the benchmark clients write `AcceptanceRecord` / `ThroughputRecord` JSON lines (`RecordLog`)
that the aggregate job reads (`read_record_file`). On disk a plan is one JSON object and a record one JSON
line whose keys are the dataclass' fields, with the run's tags (the plan's `tags`) beside them, flattened.

Reading is strict: a missing or other `schema_version`, an unknown or missing field, or a value of the wrong
type raises `SchemaError` naming the file and the field. Construction checks the same, so a writer can never
write what its reader refuses. A change to a field is a change of the version.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from ddtree.bench.records import RecordWriter, record_key
from ddtree.engine.types import DEFAULT_MAX_NEW_TOKENS, METHODS
from ddtree.jsonl import NOT_JSON, json_lines, write_json_atomic

PLAN_SCHEMA_VERSION = 1
RECORD_SCHEMA_VERSION = 1
ENGINES = ("reference", "sglang")  # reference = `ddtree serve`; sglang = SGLang's launch_server
GREEDY_VARIANT: Mapping[str, Any] = types.MappingProxyType(
    {"name": "greedy", "temperature": 0.0, "top_k": -1, "top_p": 1.0})


class SchemaError(ValueError):
    """A plan or record that does not match its dataclass; the message names the file and the field."""


def check_variant(variant: Any, name: str = "variant") -> dict[str, Any]:
    """A sampling variant: a string `name` plus SGLang sampling params (temperature, top_k, top_p, ... are passed
    through as they are); temperature, top_k and top_p default to greedy's."""
    if not isinstance(variant, Mapping) or not isinstance(variant.get("name"), str):
        raise SchemaError(f"{name}: expected an object with a string `name`, got {variant!r}")
    return {**GREEDY_VARIANT, **variant}


# ---------------------------------------------------------------- conversion


def _describe(hint: Any) -> str:
    if hint is type(None):
        return "null"
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_describe(h) for h in typing.get_args(hint))
    return getattr(hint, "__name__", str(hint))


def _convert(value: Any, hint: Any, where: str) -> Any:
    """`value` checked against the type hint (JSON lists become tuples where the hint says so; objects become
    nested schema dataclasses); SchemaError naming `where` otherwise."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(value, option, where)
            except SchemaError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        raise SchemaError(f"`{where}`: expected {_describe(hint)}, got {value!r}")
    if isinstance(hint, type) and issubclass(hint, _Schema):
        if isinstance(value, hint):
            return value
        if isinstance(value, Mapping):
            return hint.from_json(value)
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    elif hint in (int, str, bool):
        if isinstance(value, hint) and not (hint is int and isinstance(value, bool)):
            return value
    elif origin in (tuple, list):
        if isinstance(value, (list, tuple)):
            items = [_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
            return tuple(items) if origin is tuple else items
    elif origin is dict:
        if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            return {k: _convert(v, args[1], f"{where}.{k}") for k, v in value.items()}
    else:
        raise TypeError(f"schema type {hint!r} of `{where}` is not supported")
    raise SchemaError(f"`{where}`: expected {_describe(hint)}, got {value!r}")


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _to_json(value: Any) -> Any:
    if isinstance(value, _Schema):
        return value.to_json()
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _to_json(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class _Schema:
    """Strict JSON conversion of a frozen dataclass. Fields with a default may be left out of the JSON (and a
    None one is left out when written), the others are required; `schema_version`, where a class has it, is
    always required."""

    def __post_init__(self) -> None:
        hints = _hints(type(self))
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _convert(getattr(self, f.name), hints[f.name], self._path(f.name)))
        version = getattr(type(self), "SCHEMA_VERSION", None)
        if version is not None and self.schema_version != version:  # type: ignore[attr-defined]
            raise SchemaError(f"`{self._path('schema_version')}`: this code reads version {version}, "
                              f"got {self.schema_version!r}")  # type: ignore[attr-defined]
        self.check()

    def check(self) -> None:
        """Rules across fields (a subclass adds its own)."""

    PREFIX: ClassVar[str] = ""  # of its fields' names in messages: the field it stands in ("server.")

    def _path(self, name: str) -> str:
        return f"{self.PREFIX}{name}"

    @classmethod
    def _fields(cls) -> dict[str, dataclasses.Field]:
        return {f.name: f for f in dataclasses.fields(cls) if f.init}

    @classmethod
    def _required(cls) -> list[str]:
        required = [name for name, f in cls._fields().items()
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        return required + (["schema_version"] if "schema_version" in cls._fields() else [])

    @classmethod
    def from_json(cls, data: Any, where: str | None = None):  # -> Self
        """The dataclass of a parsed JSON object; `where` (the file) starts every error message."""
        try:
            if not isinstance(data, Mapping):
                raise SchemaError(f"expected a JSON object, got {type(data).__name__}")
            fields = cls._fields()
            unknown = sorted(set(data) - set(fields))
            if unknown:
                raise SchemaError(f"unknown field `{cls.PREFIX}{unknown[0]}` (expected {', '.join(fields)})")
            missing = [name for name in cls._required() if name not in data]
            if missing:
                raise SchemaError(f"missing field `{cls.PREFIX}{missing[0]}`")
            return cls(**data)
        except SchemaError as exc:
            raise SchemaError(f"{where}: {exc}" if where else str(exc)) from None

    def to_json(self) -> dict[str, Any]:
        out = {}
        for name, f in self._fields().items():
            value = getattr(self, name)
            if value is None and f.default is None:
                continue
            out[name] = _to_json(value)
        return out


# ---------------------------------------------------------------- plan


@dataclass(frozen=True)
class ServerSpec(_Schema):
    """How to start the one server of a session."""

    model: str  # a pair directory (target/ + drafter/), or for SGLang a hub id (drafter then in extra_args)
    engine: str = "reference"  # one of ENGINES
    method: str = "ddtree"  # one of METHODS
    budget: int = 64  # ddtree's node budget; ar and dflash get it too and ignore it
    device: str | None = None  # reference: default cpu; sglang: passed on unless cuda
    dtype: str | None = None  # reference: default float32; sglang: passed on when set
    extra_args: tuple[str, ...] = ()
    health_timeout_s: float = 600.0
    log: str | None = None  # the server's log (default: beside the summary)

    PREFIX: ClassVar[str] = "server."

    def check(self) -> None:
        if self.engine not in ENGINES:
            raise SchemaError(f"`server.engine` must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.method not in METHODS:
            raise SchemaError(f"`server.method` must be one of {', '.join(METHODS)}, got {self.method!r}")


@dataclass(frozen=True)
class AcceptancePhase(_Schema):
    """Per prompt, variant and sample one `/generate`; one `AcceptanceRecord` each."""

    variants: tuple[dict[str, Any], ...] = (GREEDY_VARIANT,)
    num_prompts: int | None = None  # None: every prompt of the file
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    samples_per_prompt: int = 1  # per sampled variant (greedy ones take one)
    concurrency: int = 1
    seed_salt: str = ""  # enters every request seed (the run id in pipeline plans: independent samples per run)

    PREFIX: ClassVar[str] = "acceptance."

    def check(self) -> None:
        if not self.variants:
            raise SchemaError("`acceptance.variants`: at least one variant is needed")
        checked = tuple(check_variant(v, f"`acceptance.variants[{i}]`") for i, v in enumerate(self.variants))
        object.__setattr__(self, "variants", checked)


@dataclass(frozen=True)
class ThroughputPhase(_Schema):
    """Per concurrency level `num_requests` requests with at most that many in flight; one `ThroughputRecord` each."""

    concurrency: tuple[int, ...] = (1,)
    num_requests: int = 8
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    variant: dict[str, Any] = field(default_factory=lambda: dict(GREEDY_VARIANT))

    PREFIX: ClassVar[str] = "throughput."

    def check(self) -> None:
        object.__setattr__(self, "variant", check_variant(self.variant, "`throughput.variant`"))


@dataclass(frozen=True)
class SglangBenchPhase(_Schema):
    """SGLang's own client (`sglang.bench_serving`) once per concurrency level; skipped where sglang is absent."""

    concurrency: tuple[int, ...] = (1,)
    num_prompts: int = 8
    output_len: int = DEFAULT_MAX_NEW_TOKENS
    variant: dict[str, Any] = field(default_factory=lambda: dict(GREEDY_VARIANT))

    PREFIX: ClassVar[str] = "sglang_bench."

    def check(self) -> None:
        object.__setattr__(self, "variant", check_variant(self.variant, "`sglang_bench.variant`"))


@dataclass(frozen=True)
class PlanOutputs(_Schema):
    """Where the session writes: a JSON-lines file per phase that runs, and the summary JSON."""

    summary: str
    acceptance: str | None = None
    throughput: str | None = None
    sglang_bench: str | None = None

    PREFIX: ClassVar[str] = "out."


@dataclass(frozen=True)
class BenchPlan(_Schema):
    """One `ddtree bench session`: the server to start, what to measure against it, where the results go."""

    SCHEMA_VERSION: ClassVar[int] = PLAN_SCHEMA_VERSION
    server: ServerSpec
    prompts: str  # JSON lines {"id", "dataset", "text"}
    out: PlanOutputs
    acceptance: AcceptancePhase | None = None
    throughput: ThroughputPhase | None = None
    sglang_bench: SglangBenchPhase | None = None
    tags: dict[str, Any] = field(default_factory=dict)  # copied into every record (profile, pair, method, ...)
    schema_version: int = PLAN_SCHEMA_VERSION

    def check(self) -> None:
        if self.acceptance is None and self.throughput is None:
            raise SchemaError("the plan needs `acceptance`, `throughput` or both")
        for phase in ("acceptance", "throughput", "sglang_bench"):
            if getattr(self, phase) is not None and getattr(self.out, phase) is None:
                raise SchemaError(f"missing field `out.{phase}` (the `{phase}` phase writes there)")
        clash = sorted(set(self.tags) & (set(AcceptanceRecord.record_fields()) | set(ThroughputRecord.record_fields())))
        if clash:
            raise SchemaError(f"`tags.{clash[0]}` clashes with a record field")


def read_plan(path: str | Path) -> BenchPlan:
    """The one plan reader (relative paths in it stay relative to the working directory)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SchemaError(f"plan {path}: not valid JSON ({exc})") from None
    return BenchPlan.from_json(data, f"plan {path}")


def write_plan(path: str | Path, plan: BenchPlan) -> None:
    """The one plan writer (atomic: a reader never sees half a plan)."""
    write_json_atomic(path, plan.to_json())


# ---------------------------------------------------------------- records


@dataclass(frozen=True)
class _Record(_Schema):
    """A per-request record: every field is required on disk; the run's tags stand beside the fields."""

    KEY_FIELDS: ClassVar[tuple[str, ...]] = ()  # with the tags, the identity of a record (what a rerun skips)
    SCHEMA_VERSION: ClassVar[int] = RECORD_SCHEMA_VERSION

    @classmethod
    def record_fields(cls) -> tuple[str, ...]:
        """The keys of a record on disk besides the tags."""
        return tuple(name for name in cls._fields() if name != "tags")

    @classmethod
    def from_line(cls, data: Any, where: str, tag_keys: Collection[str]):  # -> Self
        """A record from one parsed line whose tags are exactly `tag_keys`."""
        if not isinstance(data, Mapping):
            raise SchemaError(f"{where}: expected a JSON object, got {type(data).__name__}")
        own = cls.record_fields()
        unknown = sorted(set(data) - set(own) - set(tag_keys))
        if unknown:
            raise SchemaError(f"{where}: unknown field `{unknown[0]}` (neither a field of {cls.__name__} nor a tag "
                              f"of the run: {', '.join(tag_keys) or 'none'})")
        missing = [name for name in (*tag_keys, *own) if name not in data]
        if missing:
            raise SchemaError(f"{where}: missing field `{missing[0]}`")
        tags = {k: data[k] for k in tag_keys}
        return cls.from_json({**{k: data[k] for k in own}, "tags": tags}, where)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        return {**out.pop("tags"), **out}


@dataclass(frozen=True)
class AcceptanceRecord(_Record):
    """One `/generate` of the acceptance phase (meta fields a server does not send, e.g. SGLang's, are null)."""

    KEY_FIELDS: ClassVar[tuple[str, ...]] = ("prompt_id", "variant", "sample_index")
    prompt_id: str
    dataset: str
    variant: str
    temperature: float | None
    top_k: int | None
    top_p: float | None
    sample_index: int
    seed: int
    prompt_tokens: int | None
    completion_tokens: int | None
    spec_verify_ct: int | None  # verify rounds
    tau: float | None  # completion_tokens / spec_verify_ct (the bonus included)
    accept_lens: list[int] | None  # per round, bonus excluded
    expected_accept_lens: list[float] | None  # per round, exact expectation
    stage_times: dict[str, float] | None  # seconds, keys = engine.types.STAGES
    entropies: list[float] | None  # per round, nats
    e2e_latency: float | None
    ttft: float | None
    decode_time: float | None
    output_ids: list[int] | None
    error: str | None
    tags: dict[str, Any] = field(default_factory=dict)
    schema_version: int = RECORD_SCHEMA_VERSION


@dataclass(frozen=True)
class ThroughputRecord(_Record):
    """One request of a concurrency level; TPOT = (e2e - ttft) / (completion_tokens - 1)."""

    KEY_FIELDS: ClassVar[tuple[str, ...]] = ("concurrency", "request_index")
    concurrency: int
    request_index: int
    prompt_id: str
    completion_tokens: int | None
    e2e_latency: float | None
    ttft: float | None
    tpot: float | None
    start_time: float  # wall clock (time.time)
    end_time: float
    error: str | None
    tags: dict[str, Any] = field(default_factory=dict)
    schema_version: int = RECORD_SCHEMA_VERSION


R = TypeVar("R", bound=_Record)


def read_record_file(path: str | Path, record_type: type[R], tag_keys: Collection[str]) -> list[R]:
    """The one record reader: every line of a record file as `record_type`, tagged with exactly `tag_keys`.
    A torn last line (a killed writer) is skipped; any other bad line raises naming the file and line."""
    records = []
    for number, value, last in json_lines(path):
        if value is NOT_JSON and last:
            break
        where = f"{path} line {number}"
        if value is NOT_JSON:
            raise SchemaError(f"{where}: not valid JSON")
        records.append(record_type.from_line(value, where, tag_keys))
    return records


class RecordLog(Generic[R]):
    """The one record writer: typed records of one run (its `tags`) appended to a crash-safe JSON-lines file.

    Opening an existing file resumes it (`RecordWriter`: a torn line and failed records are dropped); the records
    kept are read back typed into `existing`, so a file of another schema version is refused, not extended."""

    def __init__(self, path: str | Path, record_type: type[R], tags: Mapping[str, Any]) -> None:
        if not isinstance(tags, Mapping):
            raise SchemaError(f"tags: expected a JSON object, got {tags!r}")
        clash = sorted(set(tags) & set(record_type.record_fields()))
        if clash:
            raise SchemaError(f"tags: keys {clash} clash with record fields")
        self.path = Path(path)
        self.record_type = record_type
        self.tags = dict(tags)
        self._file = RecordWriter(self.path, [*self.tags, *record_type.KEY_FIELDS])
        try:
            self.existing: list[R] = [record_type.from_line(r, f"{self.path} record {i + 1}", self.tags)
                                      for i, r in enumerate(self._file.existing)]
        except SchemaError:
            self._file.close()
            raise

    def key(self, **key_values: Any) -> str:
        """The identity of the record of this run with these KEY_FIELDS values."""
        return record_key({**self.tags, **key_values}, self._file.key_fields)

    def key_of(self, record: R) -> str:
        return self._file.key(record.to_json())

    def is_done(self, **key_values: Any) -> bool:
        """Whether that record is already stored (counts it as skipped)."""
        return self._file.is_done({**self.tags, **key_values})

    def write(self, record: R) -> None:
        if record.tags != self.tags:
            raise ValueError(f"{self.path}: a record tagged {record.tags} in a log of {self.tags}")
        self._file.write(record.to_json())

    @property
    def written(self) -> int:
        return self._file.written

    @property
    def skipped(self) -> int:
        return self._file.skipped

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RecordLog[R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
