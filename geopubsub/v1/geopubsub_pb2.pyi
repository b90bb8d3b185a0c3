from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Point(_message.Message):
    __slots__ = ("lon", "lat")
    LON_FIELD_NUMBER: _ClassVar[int]
    LAT_FIELD_NUMBER: _ClassVar[int]
    lon: float
    lat: float
    def __init__(self, lon: _Optional[float] = ..., lat: _Optional[float] = ...) -> None: ...

class Rect(_message.Message):
    __slots__ = ("min_lon", "min_lat", "max_lon", "max_lat")
    MIN_LON_FIELD_NUMBER: _ClassVar[int]
    MIN_LAT_FIELD_NUMBER: _ClassVar[int]
    MAX_LON_FIELD_NUMBER: _ClassVar[int]
    MAX_LAT_FIELD_NUMBER: _ClassVar[int]
    min_lon: float
    min_lat: float
    max_lon: float
    max_lat: float
    def __init__(self, min_lon: _Optional[float] = ..., min_lat: _Optional[float] = ..., max_lon: _Optional[float] = ..., max_lat: _Optional[float] = ...) -> None: ...

class Circle(_message.Message):
    __slots__ = ("lon", "lat", "radius_m")
    LON_FIELD_NUMBER: _ClassVar[int]
    LAT_FIELD_NUMBER: _ClassVar[int]
    RADIUS_M_FIELD_NUMBER: _ClassVar[int]
    lon: float
    lat: float
    radius_m: float
    def __init__(self, lon: _Optional[float] = ..., lat: _Optional[float] = ..., radius_m: _Optional[float] = ...) -> None: ...

class Polygon(_message.Message):
    __slots__ = ("rings",)
    RINGS_FIELD_NUMBER: _ClassVar[int]
    rings: _containers.RepeatedCompositeFieldContainer[Ring]
    def __init__(self, rings: _Optional[_Iterable[_Union[Ring, _Mapping]]] = ...) -> None: ...

class Ring(_message.Message):
    __slots__ = ("points",)
    POINTS_FIELD_NUMBER: _ClassVar[int]
    points: _containers.RepeatedCompositeFieldContainer[Point]
    def __init__(self, points: _Optional[_Iterable[_Union[Point, _Mapping]]] = ...) -> None: ...

class AttributeValue(_message.Message):
    __slots__ = ("number", "text")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    number: float
    text: str
    def __init__(self, number: _Optional[float] = ..., text: _Optional[str] = ...) -> None: ...

class Predicate(_message.Message):
    __slots__ = ("attr", "op", "value", "values", "weight")
    ATTR_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    attr: str
    op: str
    value: AttributeValue
    values: _containers.RepeatedCompositeFieldContainer[AttributeValue]
    weight: float
    def __init__(self, attr: _Optional[str] = ..., op: _Optional[str] = ..., value: _Optional[_Union[AttributeValue, _Mapping]] = ..., values: _Optional[_Iterable[_Union[AttributeValue, _Mapping]]] = ..., weight: _Optional[float] = ...) -> None: ...

class Subscription(_message.Message):
    __slots__ = ("id", "keywords", "expr", "rect", "circle", "polygon", "point", "moving", "ephemeral", "predicates", "threshold", "alpha", "weights")
    class WeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    KEYWORDS_FIELD_NUMBER: _ClassVar[int]
    EXPR_FIELD_NUMBER: _ClassVar[int]
    RECT_FIELD_NUMBER: _ClassVar[int]
    CIRCLE_FIELD_NUMBER: _ClassVar[int]
    POLYGON_FIELD_NUMBER: _ClassVar[int]
    POINT_FIELD_NUMBER: _ClassVar[int]
    MOVING_FIELD_NUMBER: _ClassVar[int]
    EPHEMERAL_FIELD_NUMBER: _ClassVar[int]
    PREDICATES_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    keywords: _containers.RepeatedScalarFieldContainer[str]
    expr: str
    rect: Rect
    circle: Circle
    polygon: Polygon
    point: Point
    moving: bool
    ephemeral: bool
    predicates: _containers.RepeatedCompositeFieldContainer[Predicate]
    threshold: float
    alpha: float
    weights: _containers.ScalarMap[str, float]
    def __init__(self, id: _Optional[str] = ..., keywords: _Optional[_Iterable[str]] = ..., expr: _Optional[str] = ..., rect: _Optional[_Union[Rect, _Mapping]] = ..., circle: _Optional[_Union[Circle, _Mapping]] = ..., polygon: _Optional[_Union[Polygon, _Mapping]] = ..., point: _Optional[_Union[Point, _Mapping]] = ..., moving: bool = ..., ephemeral: bool = ..., predicates: _Optional[_Iterable[_Union[Predicate, _Mapping]]] = ..., threshold: _Optional[float] = ..., alpha: _Optional[float] = ..., weights: _Optional[_Mapping[str, float]] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("id", "keywords", "text", "point", "rect", "ttl_s", "time", "attributes")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AttributeValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttributeValue, _Mapping]] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    KEYWORDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    POINT_FIELD_NUMBER: _ClassVar[int]
    RECT_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    id: str
    keywords: _containers.RepeatedScalarFieldContainer[str]
    text: str
    point: Point
    rect: Rect
    ttl_s: float
    time: float
    attributes: _containers.MessageMap[str, AttributeValue]
    def __init__(self, id: _Optional[str] = ..., keywords: _Optional[_Iterable[str]] = ..., text: _Optional[str] = ..., point: _Optional[_Union[Point, _Mapping]] = ..., rect: _Optional[_Union[Rect, _Mapping]] = ..., ttl_s: _Optional[float] = ..., time: _Optional[float] = ..., attributes: _Optional[_Mapping[str, AttributeValue]] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("subscription_id", "sequence", "kind", "message", "time", "gap_from", "score")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ADD: _ClassVar[Delivery.Kind]
        REMOVE: _ClassVar[Delivery.Kind]
        GAP: _ClassVar[Delivery.Kind]
    ADD: Delivery.Kind
    REMOVE: Delivery.Kind
    GAP: Delivery.Kind
    SUBSCRIPTION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    GAP_FROM_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    subscription_id: str
    sequence: int
    kind: Delivery.Kind
    message: Message
    time: float
    gap_from: int
    score: float
    def __init__(self, subscription_id: _Optional[str] = ..., sequence: _Optional[int] = ..., kind: _Optional[_Union[Delivery.Kind, str]] = ..., message: _Optional[_Union[Message, _Mapping]] = ..., time: _Optional[float] = ..., gap_from: _Optional[int] = ..., score: _Optional[float] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("subscription", "subscriptions")
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    subscription: Subscription
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    def __init__(self, subscription: _Optional[_Union[Subscription, _Mapping]] = ..., subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("id", "ids")
    ID_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ...) -> None: ...

class UnsubscribeRequest(_message.Message):
    __slots__ = ("id", "ids")
    ID_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., ids: _Optional[_Iterable[str]] = ...) -> None: ...

class UnsubscribeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetSubscriptionRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("message", "messages", "top_k")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    message: Message
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    top_k: int
    def __init__(self, message: _Optional[_Union[Message, _Mapping]] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., top_k: _Optional[int] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("id", "matched", "ids", "matches")
    ID_FIELD_NUMBER: _ClassVar[int]
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    MATCHES_FIELD_NUMBER: _ClassVar[int]
    id: str
    matched: int
    ids: _containers.RepeatedScalarFieldContainer[str]
    matches: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, id: _Optional[str] = ..., matched: _Optional[int] = ..., ids: _Optional[_Iterable[str]] = ..., matches: _Optional[_Iterable[int]] = ...) -> None: ...

class UpdateLocationRequest(_message.Message):
    __slots__ = ("id", "point", "moves")
    ID_FIELD_NUMBER: _ClassVar[int]
    POINT_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    id: str
    point: Point
    moves: _containers.RepeatedCompositeFieldContainer[LocationUpdate]
    def __init__(self, id: _Optional[str] = ..., point: _Optional[_Union[Point, _Mapping]] = ..., moves: _Optional[_Iterable[_Union[LocationUpdate, _Mapping]]] = ...) -> None: ...

class LocationUpdate(_message.Message):
    __slots__ = ("id", "point")
    ID_FIELD_NUMBER: _ClassVar[int]
    POINT_FIELD_NUMBER: _ClassVar[int]
    id: str
    point: Point
    def __init__(self, id: _Optional[str] = ..., point: _Optional[_Union[Point, _Mapping]] = ...) -> None: ...

class UpdateLocationResponse(_message.Message):
    __slots__ = ("updates",)
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    updates: _containers.RepeatedCompositeFieldContainer[Delivery]
    def __init__(self, updates: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ...) -> None: ...

class StreamResultsRequest(_message.Message):
    __slots__ = ("id", "after_sequence")
    ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    id: str
    after_sequence: int
    def __init__(self, id: _Optional[str] = ..., after_sequence: _Optional[int] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReloadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReloadResponse(_message.Message):
    __slots__ = ("subscriptions",)
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    subscriptions: int
    def __init__(self, subscriptions: _Optional[int] = ...) -> None: ...

class RebalanceRequest(_message.Message):
    __slots__ = ("shards",)
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    shards: int
    def __init__(self, shards: _Optional[int] = ...) -> None: ...

class RebalanceResponse(_message.Message):
    __slots__ = ("shards", "subscriptions", "live_messages")
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    LIVE_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    shards: int
    subscriptions: int
    live_messages: int
    def __init__(self, shards: _Optional[int] = ..., subscriptions: _Optional[int] = ..., live_messages: _Optional[int] = ...) -> None: ...

class ShardStats(_message.Message):
    __slots__ = ("shard", "subscriptions", "live_messages")
    SHARD_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    LIVE_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    shard: int
    subscriptions: int
    live_messages: int
    def __init__(self, shard: _Optional[int] = ..., subscriptions: _Optional[int] = ..., live_messages: _Optional[int] = ...) -> None: ...

class Stats(_message.Message):
    __slots__ = ("subscriptions", "moving_subscriptions", "live_messages", "published", "deliveries", "dropped_deliveries", "shards", "uptime_s", "moves", "rounds", "rejected_overload", "shard_failures", "unlogged_deliveries", "gaps", "log_write_failures", "log_rounds", "log_bytes")
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    MOVING_SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    LIVE_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    REJECTED_OVERLOAD_FIELD_NUMBER: _ClassVar[int]
    SHARD_FAILURES_FIELD_NUMBER: _ClassVar[int]
    UNLOGGED_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    GAPS_FIELD_NUMBER: _ClassVar[int]
    LOG_WRITE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    LOG_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    LOG_BYTES_FIELD_NUMBER: _ClassVar[int]
    subscriptions: int
    moving_subscriptions: int
    live_messages: int
    published: int
    deliveries: int
    dropped_deliveries: int
    shards: _containers.RepeatedCompositeFieldContainer[ShardStats]
    uptime_s: float
    moves: int
    rounds: int
    rejected_overload: int
    shard_failures: int
    unlogged_deliveries: int
    gaps: int
    log_write_failures: int
    log_rounds: int
    log_bytes: int
    def __init__(self, subscriptions: _Optional[int] = ..., moving_subscriptions: _Optional[int] = ..., live_messages: _Optional[int] = ..., published: _Optional[int] = ..., deliveries: _Optional[int] = ..., dropped_deliveries: _Optional[int] = ..., shards: _Optional[_Iterable[_Union[ShardStats, _Mapping]]] = ..., uptime_s: _Optional[float] = ..., moves: _Optional[int] = ..., rounds: _Optional[int] = ..., rejected_overload: _Optional[int] = ..., shard_failures: _Optional[int] = ..., unlogged_deliveries: _Optional[int] = ..., gaps: _Optional[int] = ..., log_write_failures: _Optional[int] = ..., log_rounds: _Optional[int] = ..., log_bytes: _Optional[int] = ...) -> None: ...

class DensityRequest(_message.Message):
    __slots__ = ("view", "cols", "rows", "keyword")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    KEYWORD_FIELD_NUMBER: _ClassVar[int]
    view: Rect
    cols: int
    rows: int
    keyword: str
    def __init__(self, view: _Optional[_Union[Rect, _Mapping]] = ..., cols: _Optional[int] = ..., rows: _Optional[int] = ..., keyword: _Optional[str] = ...) -> None: ...

class Density(_message.Message):
    __slots__ = ("view", "cols", "rows", "counts", "subscriptions")
    VIEW_FIELD_NUMBER: _ClassVar[int]
    COLS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    view: Rect
    cols: int
    rows: int
    counts: _containers.RepeatedScalarFieldContainer[int]
    subscriptions: int
    def __init__(self, view: _Optional[_Union[Rect, _Mapping]] = ..., cols: _Optional[int] = ..., rows: _Optional[int] = ..., counts: _Optional[_Iterable[int]] = ..., subscriptions: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("keyword", "max_messages_per_s", "max_movers")
    KEYWORD_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_PER_S_FIELD_NUMBER: _ClassVar[int]
    MAX_MOVERS_FIELD_NUMBER: _ClassVar[int]
    keyword: str
    max_messages_per_s: int
    max_movers: int
    def __init__(self, keyword: _Optional[str] = ..., max_messages_per_s: _Optional[int] = ..., max_movers: _Optional[int] = ...) -> None: ...

class WatchedMessage(_message.Message):
    __slots__ = ("message", "matched")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MATCHED_FIELD_NUMBER: _ClassVar[int]
    message: Message
    matched: int
    def __init__(self, message: _Optional[_Union[Message, _Mapping]] = ..., matched: _Optional[int] = ...) -> None: ...

class WatchEvents(_message.Message):
    __slots__ = ("time", "published", "expired", "moved", "unsubscribed", "published_count", "skipped_messages", "moves_count")
    TIME_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    MOVED_FIELD_NUMBER: _ClassVar[int]
    UNSUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_COUNT_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MOVES_COUNT_FIELD_NUMBER: _ClassVar[int]
    time: float
    published: _containers.RepeatedCompositeFieldContainer[WatchedMessage]
    expired: _containers.RepeatedScalarFieldContainer[str]
    moved: _containers.RepeatedCompositeFieldContainer[LocationUpdate]
    unsubscribed: _containers.RepeatedScalarFieldContainer[str]
    published_count: int
    skipped_messages: int
    moves_count: int
    def __init__(self, time: _Optional[float] = ..., published: _Optional[_Iterable[_Union[WatchedMessage, _Mapping]]] = ..., expired: _Optional[_Iterable[str]] = ..., moved: _Optional[_Iterable[_Union[LocationUpdate, _Mapping]]] = ..., unsubscribed: _Optional[_Iterable[str]] = ..., published_count: _Optional[int] = ..., skipped_messages: _Optional[int] = ..., moves_count: _Optional[int] = ...) -> None: ...
