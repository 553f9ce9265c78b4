"""The message as clients see it (camellia's CamelliaDelayMsg), from the json Redis stores."""
import orjson

FIELDS = ("topic", "msgId", "msg", "produceTime", "triggerTime", "expireTime", "maxRetry", "retry", "status")


def decode_message(raw: str) -> dict:
    stored = orjson.loads(raw)
    return {name: stored.get(name) for name in FIELDS}
