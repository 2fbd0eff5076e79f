from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Transport(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSPORT_INLINE: _ClassVar[Transport]
    TRANSPORT_SHM: _ClassVar[Transport]
TRANSPORT_INLINE: Transport
TRANSPORT_SHM: Transport

class OpenRequest(_message.Message):
    __slots__ = ("protocol_version", "rank", "world_size", "microbatch_size", "from_start", "from_step", "state_json", "skip_microbatches", "transport", "fingerprint", "readers", "reader", "stream")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    MICROBATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    FROM_START_FIELD_NUMBER: _ClassVar[int]
    FROM_STEP_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    SKIP_MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    READERS_FIELD_NUMBER: _ClassVar[int]
    READER_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    rank: int
    world_size: int
    microbatch_size: int
    from_start: bool
    from_step: int
    state_json: str
    skip_microbatches: int
    transport: Transport
    fingerprint: str
    readers: int
    reader: int
    stream: str
    def __init__(self, protocol_version: _Optional[int] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., microbatch_size: _Optional[int] = ..., from_start: _Optional[bool] = ..., from_step: _Optional[int] = ..., state_json: _Optional[str] = ..., skip_microbatches: _Optional[int] = ..., transport: _Optional[_Union[Transport, str]] = ..., fingerprint: _Optional[str] = ..., readers: _Optional[int] = ..., reader: _Optional[int] = ..., stream: _Optional[str] = ...) -> None: ...

class OpenReply(_message.Message):
    __slots__ = ("session_id", "protocol_version", "step", "lane_start", "lane_stop", "seq_tokens", "microbatches_per_step", "fingerprint", "shm_path", "shm_bytes", "readers", "schema_json", "layout", "slot_bytes", "stream", "steps", "vision")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    LANE_START_FIELD_NUMBER: _ClassVar[int]
    LANE_STOP_FIELD_NUMBER: _ClassVar[int]
    SEQ_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    SHM_PATH_FIELD_NUMBER: _ClassVar[int]
    SHM_BYTES_FIELD_NUMBER: _ClassVar[int]
    READERS_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    SLOT_BYTES_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    VISION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    protocol_version: int
    step: int
    lane_start: int
    lane_stop: int
    seq_tokens: int
    microbatches_per_step: int
    fingerprint: str
    shm_path: str
    shm_bytes: int
    readers: int
    schema_json: str
    layout: _containers.RepeatedCompositeFieldContainer[ColumnSlot]
    slot_bytes: int
    stream: str
    steps: int
    vision: VisionContract
    def __init__(self, session_id: _Optional[str] = ..., protocol_version: _Optional[int] = ..., step: _Optional[int] = ..., lane_start: _Optional[int] = ..., lane_stop: _Optional[int] = ..., seq_tokens: _Optional[int] = ..., microbatches_per_step: _Optional[int] = ..., fingerprint: _Optional[str] = ..., shm_path: _Optional[str] = ..., shm_bytes: _Optional[int] = ..., readers: _Optional[int] = ..., schema_json: _Optional[str] = ..., layout: _Optional[_Iterable[_Union[ColumnSlot, _Mapping]]] = ..., slot_bytes: _Optional[int] = ..., stream: _Optional[str] = ..., steps: _Optional[int] = ..., vision: _Optional[_Union[VisionContract, _Mapping]] = ...) -> None: ...

class VisionContract(_message.Message):
    __slots__ = ("image_id", "video_id", "vision_start_id", "vision_end_id", "pad_id", "patch_size", "temporal_patch_size", "merge_size", "order", "image_mean", "image_std")
    IMAGE_ID_FIELD_NUMBER: _ClassVar[int]
    VIDEO_ID_FIELD_NUMBER: _ClassVar[int]
    VISION_START_ID_FIELD_NUMBER: _ClassVar[int]
    VISION_END_ID_FIELD_NUMBER: _ClassVar[int]
    PAD_ID_FIELD_NUMBER: _ClassVar[int]
    PATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    TEMPORAL_PATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MERGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    IMAGE_MEAN_FIELD_NUMBER: _ClassVar[int]
    IMAGE_STD_FIELD_NUMBER: _ClassVar[int]
    image_id: int
    video_id: int
    vision_start_id: int
    vision_end_id: int
    pad_id: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    order: str
    image_mean: _containers.RepeatedScalarFieldContainer[float]
    image_std: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, image_id: _Optional[int] = ..., video_id: _Optional[int] = ..., vision_start_id: _Optional[int] = ..., vision_end_id: _Optional[int] = ..., pad_id: _Optional[int] = ..., patch_size: _Optional[int] = ..., temporal_patch_size: _Optional[int] = ..., merge_size: _Optional[int] = ..., order: _Optional[str] = ..., image_mean: _Optional[_Iterable[float]] = ..., image_std: _Optional[_Iterable[float]] = ...) -> None: ...

class ColumnSlot(_message.Message):
    __slots__ = ("name", "dtype", "offset", "nbytes", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    offset: int
    nbytes: int
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., offset: _Optional[int] = ..., nbytes: _Optional[int] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("session_id", "release", "has_position", "step", "consumed")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    HAS_POSITION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    release: _containers.RepeatedScalarFieldContainer[int]
    has_position: bool
    step: int
    consumed: int
    def __init__(self, session_id: _Optional[str] = ..., release: _Optional[_Iterable[int]] = ..., has_position: _Optional[bool] = ..., step: _Optional[int] = ..., consumed: _Optional[int] = ...) -> None: ...

class Microbatch(_message.Message):
    __slots__ = ("step", "index", "sequences", "slot", "offset", "ended", "state_json", "lane_digests", "columns", "step_tokens")
    class LaneDigestsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: bytes
        def __init__(self, key: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    LANE_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    STEP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    step: int
    index: int
    sequences: int
    slot: int
    offset: int
    ended: bool
    state_json: str
    lane_digests: _containers.ScalarMap[int, bytes]
    columns: _containers.RepeatedScalarFieldContainer[bytes]
    step_tokens: int
    def __init__(self, step: _Optional[int] = ..., index: _Optional[int] = ..., sequences: _Optional[int] = ..., slot: _Optional[int] = ..., offset: _Optional[int] = ..., ended: _Optional[bool] = ..., state_json: _Optional[str] = ..., lane_digests: _Optional[_Mapping[int, bytes]] = ..., columns: _Optional[_Iterable[bytes]] = ..., step_tokens: _Optional[int] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Microbatch]
    def __init__(self, items: _Optional[_Iterable[_Union[Microbatch, _Mapping]]] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("session_id", "step")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    step: int
    def __init__(self, session_id: _Optional[str] = ..., step: _Optional[int] = ...) -> None: ...

class CheckpointReply(_message.Message):
    __slots__ = ("step", "object", "committed", "state_json")
    STEP_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_FIELD_NUMBER: _ClassVar[int]
    STATE_JSON_FIELD_NUMBER: _ClassVar[int]
    step: int
    object: str
    committed: bool
    state_json: str
    def __init__(self, step: _Optional[int] = ..., object: _Optional[str] = ..., committed: _Optional[bool] = ..., state_json: _Optional[str] = ...) -> None: ...

class CloseRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthReply(_message.Message):
    __slots__ = ("serving", "protocol_version", "fingerprint", "lanes", "schema_json", "vision")
    SERVING_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    LANES_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    VISION_FIELD_NUMBER: _ClassVar[int]
    serving: bool
    protocol_version: int
    fingerprint: str
    lanes: int
    schema_json: str
    vision: VisionContract
    def __init__(self, serving: _Optional[bool] = ..., protocol_version: _Optional[int] = ..., fingerprint: _Optional[str] = ..., lanes: _Optional[int] = ..., schema_json: _Optional[str] = ..., vision: _Optional[_Union[VisionContract, _Mapping]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsReply(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...
