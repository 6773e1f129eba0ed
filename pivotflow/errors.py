"""Every exception pivotflow raises. Each says in its docstring when it is raised."""

from __future__ import annotations


class PivotflowError(Exception):
    """Base class of every error pivotflow raises on purpose."""


class ConfigError(PivotflowError):
    """A configuration value or a `--set` override is unknown, duplicated or of the wrong type."""


class GraphError(PivotflowError):
    """A graph file cannot be loaded or the graph fails validation (names node and file line)."""


class ModelConfigError(PivotflowError):
    """A model config is inconsistent, or a checkpoint's tensors do not match its config."""


class CheckpointError(PivotflowError):
    """A checkpoint or cache file is missing, corrupt or unreadable (names the file)."""


class RequestError(PivotflowError):
    """A generation request is invalid: empty or too long prompt, unknown token, bad params."""


class TokenizerError(PivotflowError):
    """Text holds a character the tokenizer does not know, or ids are out of range."""


class ProtocolError(PivotflowError):
    """A peer speaks another protocol version, or a frame cannot be decoded."""


class WorkerError(PivotflowError):
    """A worker failed to start, died, or reported an error it could not recover from."""


class EngineError(PivotflowError):
    """An inference engine is unavailable (optional extra missing) or misused."""


class TaskError(PivotflowError):
    """A task name or option is unknown or invalid, or a dataset file/line cannot be read."""


class RLError(PivotflowError):
    """An RL math input is invalid: wrong shape, too small a group, non-finite reward, bad knob."""


class MetricsError(PivotflowError):
    """A run record is invalid or malformed (names the file and line), or a meter's time went back."""


class TransportError(PivotflowError):
    """A transport is started twice, or used after it was closed; or its endpoint cannot be bound."""


class RunInterrupted(PivotflowError):
    """The run was stopped by Ctrl-C (SIGINT); records are flushed and workers reaped."""


class RunTerminated(RunInterrupted):
    """The run was stopped by SIGTERM (a scheduler, ``docker stop``), handled as Ctrl-C is."""


class CurveKeyError(ConfigError):
    """CurveZMQ keys are missing, malformed, too widely readable, or unsupported by libzmq."""


class SimulationError(PivotflowError):
    """A simulated cluster cannot go on: virtual time deadlocked, or a simulated worker was misused."""


class ToolError(PivotflowError):
    """A tool is defined wrongly, cannot be loaded from its `module:attr` path, or its pool is misused."""


class ToolCallError(ToolError):
    """Generated text holds a malformed tool call, or a call's arguments do not fit the tool's schema."""


class StageError(PivotflowError):
    """A stage function (map, group, filter, a judge's template or parse) raised, returned a
    value of the wrong type or a non-finite number, or ran past its ``deadline_s``; names the
    stage, the graph file's line and the sample. ``on_error`` is the stage's policy."""

    def __init__(self, message: str, *, stage: str = "", group_id: int = -1,
                 on_error: str = "stop") -> None:
        super().__init__(message)
        self.stage, self.group_id, self.on_error = stage, group_id, on_error
