"""The agent <-> manager wire protocol (SPEC §6-§7): every message, defined once.

Field names live only here. A message is a frozen dataclass; ``encode`` turns it into
one compact JSON object and ``decode`` back, through the one generic codec
(``specon.wire.codec``), so a new field is a new annotated attribute and nothing else.

Envelope: every message is ``{"version": "1.0", "kind": "<class name>", ...fields}``.
``version`` is ``MAJOR.MINOR``. A different major version is rejected, naming the
version received and the one spoken here. A *higher* minor version is accepted and
its unknown fields are ignored (minor versions only ever add fields with defaults);
at our own minor version or below, an unknown field is an error, because it can only
be a bug. A missing or mistyped field is an error naming its path
(``containers[3].category: missing``).

Non-finite floats are rejected, on both sides: JSON has no NaN or infinity, and a
NaN loss never enters E (SPEC §2), so one appearing here is a bug to surface, not a
value to smuggle through as ``null``. ``encode`` raises ``ProtocolError`` naming the
field; ``decode`` refuses ``NaN``/``Infinity`` tokens and numbers that overflow.

Clocks: times an agent sends (``sent_at``, ``t_cc``, ``finished_at``) are on the
agent's clock; the manager translates them with the same message's ``sent_at``.
Times the manager sends (``manager_time``, ``Command.deadline``) are on its clock;
``CommandBatch.remaining`` gives an agent the seconds left for a command.

Flow: the agent POSTs a ``Heartbeat`` every ``heartbeat_interval`` to
``HEARTBEAT_PATH`` and a ``ReallocationRequest`` at once to ``REQUEST_PATH``; both
are answered with a ``CommandBatch`` (so agents need no inbound port). Results of
commands ride on the next heartbeat until a batch acknowledges it (``ack``). On exit
the agent POSTs a ``Goodbye``. Between heartbeats the agent keeps one ``Poll`` open at
``POLL_PATH`` so a command reaches it as soon as the manager issues it.
``GET STATUS_PATH`` returns a ``Status``. A rejected message is answered with an
``ErrorReply``; every request carries ``AUTH_HEADER: Bearer <token>``.
"""

from __future__ import annotations

import enum
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from specon.model import WEIGHT_MAX, WEIGHT_MIN, Category, ContainerId, Resources, WorkerId
from specon.wire import codec, fastpath
from specon.wire.checks import check
from specon.wire.gpu import GpuDevice, GpuUse
from specon.wire.limits import (
    BYTES,
    COUNT,
    FINITE,
    ID,
    LABELS,
    MAX_GPU_DEVICES,
    MAX_LABEL_VALUE,
    MAX_POLL_WAIT,
    MAX_QUALITY_MODELS,
    MAX_RESULTS,
    SHORT_TEXT,
    TAINTS,
    TEXT,
    TIME,
    Items,
    Range,
    Text,
    limit,
)
from specon.wire.status import LossWindow, Phase, Status

VERSION = "1.7"
MAJOR, MINOR = (int(part) for part in VERSION.split("."))

CONTENT_TYPE = "application/json"
AUTH_HEADER = "Authorization"  # value: "Bearer <token>"
HEARTBEAT_PATH = "/v1/heartbeat"
REQUEST_PATH = "/v1/request"
GOODBYE_PATH = "/v1/goodbye"
STATUS_PATH = "/v1/status"
POLL_PATH = "/v1/poll"
# The job label that carries a job's declared total steps (``ContainerReport.job``).
STEPS_LABEL = "steps"


class ProtocolError(ValueError):
    """A message that cannot be encoded or decoded; ``path`` names the field, if one."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


# --- messages: a field's limits beyond its type are declared on it, ``field(metadata=limit(...))``
# (``specon.wire.limits``); the checks (``specon.wire.checks``) and the manager's OpenAPI
# document are derived from these and state no bound of their own.


class Action(enum.StrEnum):
    """What a ``Command`` asks an agent to do."""

    # Checkpoint the container (SIGTERM, wait up to the grace period) and stop it here.
    SAVE = "save"
    # Start the container here, restoring from ``checkpoint`` (or from scratch if None).
    START = "start"
    # Algorithm 2 has answered the container's request (moved or told to stay): freeze
    # it in CC and stop requesting (SPEC §3.5).
    MARK_MIGRATED = "mark_migrated"
    # Stop the container without a checkpoint (e.g. the job was deleted).
    STOP = "stop"


@dataclass(frozen=True, slots=True)
class ContainerReport:
    """One container in a heartbeat: the agent's view of its job (SPEC §3, §7)."""

    id: ContainerId = field(metadata=limit(ID))
    category: Category
    phase: Phase = "running"
    last_g: float | None = field(default=None, metadata=limit(FINITE))
    # When it last stepped WC -> CC, on the agent's clock (None: never converged).
    t_cc: float | None = field(default=None, metadata=limit(TIME))
    migrated: bool = False
    stalled: bool = False
    # A reallocation request is waiting for the manager's answer (repeated until answered).
    pending_request: bool = False
    # training steps done, if the job logs them
    step: int | None = field(default=None, metadata=limit(COUNT))
    # CPU-seconds (one core) the job still needs, the agent's estimate from its declared or
    # predicted steps left and its measured CPU per step (protocol 1.2; None: unknown).
    remaining_work: float | None = None
    requests: Resources = field(default_factory=Resources)
    # Labels / metadata of the job (model, submit time, declared total steps in ``STEPS_LABEL``, ...).
    job: dict[str, str] = field(default_factory=dict, hash=False, metadata=limit(LABELS))
    # Placement constraints (protocol 1.1), honoured by ``specon.policy.placement.fits``:
    # node labels a target must carry (a Kubernetes pod's nodeSelector), and the taints
    # the job tolerates, each ``key``, ``key=value``, ``key=`` (empty value), ``*`` (any
    # key), optionally ``:Effect`` (see ``placement.tolerates``). Heartbeat ``taints``
    # are ``key[=value][:Effect]``.
    selector: dict[str, str] = field(default_factory=dict, hash=False, metadata=limit(LABELS))
    tolerations: tuple[str, ...] = field(default=(), metadata=limit(TAINTS))
    # The CPU weight in effect among the worker's containers, cgroup-v2 units 1..10000
    # (protocol 1.2; None: the agent set none, or the runtime could not apply it).
    cpu_weight: int | None = field(default=None, metadata=limit(Range(WEIGHT_MIN, WEIGHT_MAX)))
    # Its loss window (protocol 1.3), sent when a tick changed it and every few heartbeats;
    # None: not sent this time, the manager keeps the last one it got (in memory only).
    window: LossWindow | None = None
    # Protocol 1.4: the GPU memory in bytes it needs per device (a hard placement constraint,
    # ``ContainerSnapshot.gpu_memory``; 0: any), and its GPU use (None: it uses no GPU, or
    # the agent has no NVML).
    gpu_memory: int = field(default=0, metadata=limit(BYTES))
    gpu: GpuUse | None = None
    # Protocol 1.7, a finished job only: the share of its steps at which it reached its quality
    # point (95 % of its loss reduction), measured by its agent over the curve it logged there
    # (``specon.policy.quality_memory``); None: not measured (no model, or not seen from its start).
    quality_share: float | None = field(default=None, metadata=limit(Range(0, 1)))


@dataclass(frozen=True, slots=True)
class CommandResult:
    """The outcome of one ``Command``, carried by the next heartbeats until acknowledged."""

    command: str = field(metadata=limit(SHORT_TEXT))  # Command.id
    ok: bool
    error: str | None = field(default=None, metadata=limit(TEXT))
    # After a save: the complete checkpoint written (path and step).
    checkpoint: str | None = field(default=None, metadata=limit(TEXT))
    checkpoint_step: int | None = field(default=None, metadata=limit(COUNT))
    # When the action completed (container stopped / started), on the agent's clock.
    finished_at: float | None = field(default=None, metadata=limit(TIME))
    # After a save: what the runtime needs to start the container elsewhere (image,
    # command, env, ...); the manager copies it into the ``start`` command.
    spec: dict[str, object] = field(default_factory=dict, hash=False)
    detail: dict[str, object] = field(default_factory=dict, hash=False)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Agent -> manager, every ``heartbeat_interval`` seconds."""

    worker: WorkerId = field(metadata=limit(ID))
    # host:port where the agent serves /healthz and /metrics
    address: str = field(metadata=limit(SHORT_TEXT))
    # Strictly increasing per worker, also across agent restarts (agents send their
    # wall clock in microseconds); lets the manager drop reordered heartbeats.
    seq: int = field(metadata=limit(COUNT))
    sent_at: float = field(metadata=limit(TIME))  # agent clock
    capacity: Resources
    usage: float = field(metadata=limit(Range(0, 1)))  # R(w, t): CPU utilisation of the worker, 0..1
    containers: tuple[ContainerReport, ...] = field(default=(), metadata=limit(Items(unique="id")))
    results: tuple[CommandResult, ...] = field(default=(), metadata=limit(Items(MAX_RESULTS)))
    labels: dict[str, str] = field(default_factory=dict, hash=False, metadata=limit(LABELS))
    taints: tuple[str, ...] = field(default=(), metadata=limit(TAINTS))
    # Protocol 1.4: the worker's GPUs (empty: none, or no NVML). ``capacity.gpu`` counts them
    # and ``labels`` carry ``specon.model.GPU_PRODUCT_LABEL`` and ``GPU_MEMORY_LABEL``.
    gpus: tuple[GpuDevice, ...] = field(default=(), metadata=limit(Items(MAX_GPU_DEVICES, unique="index")))
    # Protocol 1.7: the ``CommandBatch.quality_version`` the agent holds (0: none yet), so the
    # manager sends the quality points only when they changed; None (an agent before 1.7):
    # it takes none, none are sent.
    quality_version: int | None = field(default=None, metadata=limit(COUNT))


@dataclass(frozen=True, slots=True)
class ReallocationRequest:
    """Agent -> manager at once when a CC container slows further (SPEC §3.2, §7)."""

    worker: WorkerId = field(metadata=limit(ID))
    container: ContainerId = field(metadata=limit(ID))
    t_cc: float = field(metadata=limit(TIME))  # agent clock
    g: float
    sent_at: float = field(metadata=limit(TIME))  # agent clock


@dataclass(frozen=True, slots=True)
class Goodbye:
    """Agent -> manager on a clean exit: stop waiting for this worker's heartbeats."""

    worker: WorkerId = field(metadata=limit(ID))
    sent_at: float = field(metadata=limit(TIME))


@dataclass(frozen=True, slots=True)
class Poll:
    """Agent -> manager: wait up to ``wait`` seconds for commands (a long poll).

    Heartbeats already carry commands; the poll delivers them the moment they exist,
    which is what keeps a migration's downtime to the save and the restore themselves.
    """

    worker: WorkerId = field(metadata=limit(ID))
    sent_at: float = field(metadata=limit(TIME))  # agent clock
    wait: float = field(default=20.0, metadata=limit(Range(0, MAX_POLL_WAIT)))


@dataclass(frozen=True, slots=True)
class Command:
    """Manager -> agent: one step of a migration (or a stop). Idempotent per ``id``."""

    id: str = field(metadata=limit(SHORT_TEXT))
    action: Action
    container: ContainerId = field(metadata=limit(ID))
    deadline: float  # manager clock; see CommandBatch.remaining
    migration: str | None = None
    # start: the checkpoint to restore from (None: from scratch); save: unused.
    checkpoint: str | None = field(default=None, metadata=limit(TEXT))
    checkpoint_step: int | None = None
    # mark_migrated: the worker it is moving to (None: it stays where it is).
    target: WorkerId | None = field(default=None, metadata=limit(ID))
    # start: the container arrives already marked migrated (frozen in CC).
    migrated: bool = False
    # start: the runtime spec from the source's save result.
    spec: dict[str, object] = field(default_factory=dict, hash=False)
    # start: this start puts the job back on its source after a failed migration (a
    # rollback), not on the migration's target (protocol 1.1).
    rollback: bool = False
    # start: the worker of the job's last run is taken for lost (1.5; ``lost`` names it, 1.6):
    # a run of it is fenced by the start's new generation instead of refusing the start.
    supersede: bool = False
    lost: WorkerId | None = field(default=None, metadata=limit(ID))


@dataclass(frozen=True, slots=True)
class QualityPoint:
    """A model's quality point on this cluster (protocol 1.7): the median share of their steps
    at which its finished jobs reached quality (``specon.policy.quality_memory``)."""

    model: str = field(metadata=limit(Text(MAX_LABEL_VALUE)))
    share: float = field(metadata=limit(Range(0, 1)))


@dataclass(frozen=True, slots=True)
class CommandBatch:
    """Manager -> agent: the answer to every heartbeat and request."""

    manager_time: float = field(metadata=limit(TIME))
    policy_generation: int
    commands: tuple[Command, ...] = ()
    # The heartbeat ``seq`` this answers (None for a request): results sent in it or
    # earlier have been recorded and need not be sent again.
    ack: int | None = None
    # Protocol 1.7, sent to an agent whose heartbeat holds another ``quality_version``: every
    # model's quality point as of ``quality_version`` (the whole set, replacing the agent's).
    # None: unchanged, nothing sent.
    quality_version: int | None = field(default=None, metadata=limit(COUNT))
    quality: tuple[QualityPoint, ...] = field(
        default=(), metadata=limit(Items(MAX_QUALITY_MODELS, unique="model"))
    )

    def remaining(self, command: Command) -> float:
        """Seconds ``command`` has left, independent of clock skew between the hosts."""
        return command.deadline - self.manager_time


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """Manager -> agent (or any client): why a message was refused."""

    error: str
    path: str | None = None


Message = (
    Heartbeat
    | ReallocationRequest
    | Goodbye
    | Poll
    | CommandBatch
    | ErrorReply
    | Status
    | Command
    | CommandResult
)
MESSAGE_TYPES: tuple[type[Message], ...] = (
    Heartbeat,
    ReallocationRequest,
    Goodbye,
    Poll,
    CommandBatch,
    ErrorReply,
    Status,
    Command,
    CommandResult,
)
# The kind on the wire is the class name.
KINDS: dict[str, type[Message]] = {cls.__name__: cls for cls in MESSAGE_TYPES}
ENVELOPE_KEYS = ("version", "kind")

M = TypeVar("M", bound=Message)


# --- encode / decode --------------------------------------------------------------------


def encode(msg: Message) -> bytes:
    """The message as compact UTF-8 JSON with its envelope."""
    cls = type(msg)
    if cls is CommandBatch and (plain := _plain_batch(msg)) is not None:  # type: ignore[arg-type]
        return plain
    if KINDS.get(cls.__name__) is not cls:
        raise ProtocolError(f"not a protocol message: {cls.__name__}")
    try:
        body = codec.to_data(msg)
        out = {"version": VERSION, "kind": cls.__name__}
        out.update(body)
        return json.dumps(out, separators=(",", ":"), allow_nan=False).encode()
    except codec.SchemaError as e:
        raise _invalid(cls.__name__, "cannot encode", e) from None
    except RecursionError:
        raise ProtocolError(f"cannot encode {cls.__name__}: nested too deeply") from None
    except (TypeError, ValueError) as e:  # a value of the wrong type in a field
        raise ProtocolError(f"cannot encode {cls.__name__}: {e}") from None


def _plain_batch(b: CommandBatch) -> bytes | None:
    """The answer to nearly every heartbeat, a batch without commands, written directly: what
    the codec writes, byte for byte (``tests/unit/wire/test_fastpath.py``); None for any other."""
    t, gen, ack = b.manager_time, b.policy_generation, b.ack
    if b.commands or b.quality_version is not None or b.quality:
        return None
    if type(t) is not float or not math.isfinite(t) or type(gen) is not int:
        return None
    if ack is not None and type(ack) is not int:
        return None
    return (
        f'{{"version":"{VERSION}","kind":"CommandBatch","manager_time":{t!r},"policy_generation":{gen},'
        f'"commands":[],"ack":{"null" if ack is None else ack},"quality_version":null,"quality":[]}}'
    ).encode()


@overload
def decode(data: bytes | bytearray | str, expected: type[M]) -> M: ...
@overload
def decode(data: bytes | bytearray | str, expected: None = None) -> Message: ...
def decode(data: bytes | bytearray | str, expected: type[Any] | None = None) -> Message:
    """Parse and check one message; ``expected`` pins its kind. Raises only ``ProtocolError``.

    A well-formed message of this exact version takes msgspec's path (``specon.wire.fastpath``);
    anything else the codec's, which names the problem. Both end in the same checks."""
    if expected is not None and _is_message(expected):
        fast: Message | None = fastpath.decode(data, expected, VERSION)
        if fast is not None:
            return _checked(fast, expected.__name__)
    obj = _parse(data)
    if not isinstance(obj, dict):
        raise ProtocolError(f"expected a JSON object, got {codec.describe(obj)}")
    strict = _check_version(obj.pop("version", None))
    kind = obj.pop("kind", None)
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        if kind is None:
            raise ProtocolError("kind: missing", path="kind")
        known = ", ".join(sorted(KINDS))
        shown = repr(kind) if isinstance(kind, str) else codec.describe(kind)
        raise ProtocolError(f"kind: unknown message kind {shown} (known: {known})", path="kind")
    if expected is not None and cls is not expected:
        raise ProtocolError(f"kind: expected {expected.__name__}, got {kind}", path="kind")
    try:
        msg = codec.from_data(cls, obj, strict=strict)
    except codec.SchemaError as e:
        raise _invalid(kind, "invalid", e) from None
    except RecursionError:
        raise ProtocolError(f"invalid {kind}: nested too deeply") from None
    return _checked(msg, kind)


def _is_message(cls: type[Any]) -> bool:
    return KINDS.get(cls.__name__) is cls


def _checked(msg: M, kind: str) -> M:
    """``msg`` if it keeps every declared limit (``specon.wire.checks``)."""
    problems = check(msg)
    if problems:
        path = problems[0][0]
        listed = "; ".join(f"{p}: {w}" for p, w in problems[:20])
        raise ProtocolError(f"invalid {kind}: {listed}", path=path)
    return msg


def _invalid(kind: str, what: str, e: codec.SchemaError) -> ProtocolError:
    problems = "; ".join(map(str, e.problems))
    return ProtocolError(f"{what} {kind}: {problems}", path=codec.format_path(e.problems[0].path))


_VERSION = re.compile(r"(\d{1,6})\.(\d{1,6})")


def _check_version(version: object) -> bool:
    """Accept our major version; True when unknown fields must be refused (strict)."""
    if version is None:
        raise ProtocolError(f"version: missing (this specon speaks protocol {VERSION})", path="version")
    match = _VERSION.fullmatch(version) if isinstance(version, str) else None
    if match is None:
        raise ProtocolError(
            f"version: expected 'MAJOR.MINOR' like {VERSION!r}, got {codec.describe(version)}", path="version"
        )
    major, minor = int(match[1]), int(match[2])
    if major != MAJOR:
        raise ProtocolError(
            f"version: unsupported protocol version {version!r}; this specon speaks {VERSION} "
            f"(any {MAJOR}.x)",
            path="version",
        )
    return minor <= MINOR


def _reject_constant(name: str) -> Any:
    raise ProtocolError(f"not valid JSON: {name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ProtocolError(f"not valid JSON: number {text[:40]} overflows")
    return value


def _parse(data: object) -> Any:
    if isinstance(data, bytes | bytearray):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ProtocolError(f"not UTF-8: {e.reason} at byte {e.start}") from None
    elif isinstance(data, str):
        text = data
    else:
        raise ProtocolError(f"expected bytes or str, got {type(data).__name__}")
    try:
        obj = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except ProtocolError:
        raise
    except RecursionError:
        raise ProtocolError("not valid JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError (with line and column) or an int too long
        raise ProtocolError(f"not valid JSON: {e}") from None
    # A lone surrogate escape (\ud800) decodes to a str that no UTF-8 writer accepts: it
    # would poison every page, log line and journal row it reached. Only texts with such an
    # escape pay for the walk.
    if _SURROGATE_ESCAPE.search(text) is not None:
        _reject_surrogates(obj)
    return obj


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _reject_surrogates(obj: object, depth: int = 0) -> None:
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError:
            raise ProtocolError(f"invalid string {ascii(obj)[:60]}: a lone surrogate is not text") from None
    elif isinstance(obj, list):
        for item in obj:
            _reject_surrogates(item)
    elif isinstance(obj, dict):
        for key, item in obj.items():
            _reject_surrogates(key)
            _reject_surrogates(item)
