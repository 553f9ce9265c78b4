"""Request bodies over HTTP: the API turns bodies and query strings it cannot take into code 400
naming the problem (never a 500, never text guessed at) and honours the charset a client names."""
import logging

import orjson
import pytest

SEND = "/camellia/delayQueue/sendMsg"
FORM = {"content-type": "application/x-www-form-urlencoded"}


async def test_too_many_form_fields_is_400(api, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 5
    body = "&".join(f"f{i}=x" for i in range(6)) + "&topic=t&msg=m&delayMillis=0"
    response = await api.post("/camellia/delayQueue/sendMsg", content=body.encode(),
                              headers={"content-type": "application/x-www-form-urlencoded"})
    assert response.status_code == 200
    assert response.json() == {"code": 400, "msg": "request body has more than 5 fields"}


async def test_a_query_string_over_the_field_limit_is_400_without_a_traceback(api, caplog):
    query = "&".join(f"f{i}=x" for i in range(1001)) + "&topic=t&msg=m&delayMillis=0"
    for method in ("get", "post"):
        response = await getattr(api, method)(f"{SEND}?{query}")
        assert response.status_code == 200
        assert response.json() == {"code": 400, "msg": "query string has more than 1000 fields"}
    topic = await api.get(f"/camellia/delayQueue/getTopicInfo?{query}")
    assert topic.json() == {"code": 400, "msg": "query string has more than 1000 fields"}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


# What a client sent, and the answer naming its problem. "订单" is E8 AE A2 E5 8D 95 in UTF-8.
NOT_UTF8 = [
    ("form, a stray byte", "post", "", "topic=t&delayMillis=0&msg=订单".encode() + b"\xff", FORM,
     "request body is not valid utf-8 (byte 32)"),
    ("form, percent-encoded", "post", "", b"topic=t&delayMillis=0&msg=%E8%AE%A2%E5%8D", FORM,
     "request body field msg is not valid utf-8 once percent-decoded"),
    ("query, percent-encoded", "get", "?topic=t&delayMillis=0&msg=%E8%AE%A2%FF", b"", {},
     "query string field msg is not valid utf-8 once percent-decoded"),
    ("query, a raw byte", "get", b"?topic=t&delayMillis=0&msg=\xe8\xae", b"", {},
     "query string is not valid utf-8 (byte 26)"),
    ("json", "post", "", b'{"topic": "t", "msg": "\xe8\xae\xa2\xe5", "delayMillis": 0}',
     {"content-type": "application/json"}, "bad request: request body is not valid utf-8 (byte 26)"),
    ("multipart", "post", "",
     b'--b\r\nContent-Disposition: form-data; name="topic"\r\n\r\nt\r\n'
     b'--b\r\nContent-Disposition: form-data; name="delayMillis"\r\n\r\n0\r\n'
     b'--b\r\nContent-Disposition: form-data; name="msg"\r\n\r\n\xe8\xae\xa2\xe5\r\n--b--\r\n',
     {"content-type": "multipart/form-data; boundary=b"}, "bad request: request body is not valid utf-8 (byte 172)"),
]


@pytest.mark.parametrize("method, query, body, headers, problem", [case[1:] for case in NOT_UTF8],
                         ids=[case[0] for case in NOT_UTF8])
async def test_text_not_valid_in_its_charset_is_refused_not_guessed_at(api, method, query, body, headers, problem):
    from project.asgi import application

    # Raw bytes in a query string: httpx would percent-encode them, so the ASGI call is made by hand.
    path = SEND.encode() + (query if isinstance(query, bytes) else query.encode())
    path, _, query_string = path.partition(b"?")
    answer = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        answer.append(message)

    await application({"type": "http", "method": method.upper(), "path": path.decode(), "raw_path": path,
                       "query_string": query_string, "root_path": "", "scheme": "http", "http_version": "1.1",
                       "headers": [(k.encode(), v.encode()) for k, v in {"host": "127.0.0.1", "content-length": str(len(body)), **headers}.items()],
                       "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1), "asgi": {"version": "3.0"}},
                      receive, send)
    assert answer[0]["status"] == 200
    assert orjson.loads(answer[1]["body"]) == {"code": 400, "msg": problem}
    info = (await api.get("/camellia/delayQueue/getTopicInfo", params={"topic": "t"})).json()
    assert info["data"]["readyQueueSize"] == 0  # nothing was sent


async def test_the_same_text_valid_is_taken(api):
    order = "订单"
    sent = [
        await api.post(SEND, content=f"topic=t&delayMillis=0&msg={order}".encode(), headers=FORM),
        await api.post(SEND, content=b"topic=t&delayMillis=0&msg=%E8%AE%A2%E5%8D%95", headers=FORM),
        await api.get(SEND, params={"topic": "t", "delayMillis": 0, "msg": order}),
        await api.post(SEND, json={"topic": "t", "delayMillis": 0, "msg": order}),
        await api.post(SEND, data={"topic": "t", "delayMillis": "0", "msg": order}, files={"f": b"\xff"}),
    ]
    assert [r.json()["delayMsg"]["msg"] for r in sent] == [order] * 5


async def test_form_body_over_the_upload_limit_is_400(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = await api.post("/camellia/delayQueue/sendMsg",
                              data={"topic": "t", "msg": "x" * 2000, "delayMillis": "0"})
    assert response.status_code == 200
    assert response.json() == {"code": 400, "msg": "request body is over 1000 bytes"}
    ok = await api.post("/camellia/delayQueue/sendMsg", data={"topic": "t", "msg": "x" * 900, "delayMillis": "0"})
    assert ok.json()["code"] == 200


async def test_form_charset_is_honoured(api):
    body = "topic=t&msg=caf%E9&delayMillis=0".encode()
    response = await api.post("/camellia/delayQueue/sendMsg", content=body,
                              headers={"content-type": "application/x-www-form-urlencoded; charset=iso-8859-1"})
    assert response.json()["delayMsg"]["msg"] == "café"


async def test_json_bodies_decode_strictly_and_by_charset(api):
    url = "/camellia/delayQueue/sendMsg"
    nan = await api.post(url, content=b'{"topic": "t", "msg": "m", "delayMillis": NaN}',
                         headers={"content-type": "application/json"})
    assert nan.json()["code"] == 400 and "JSON parse error" in nan.json()["msg"]
    latin = await api.post(url, content='{"topic": "t", "msg": "café", "delayMillis": 0}'.encode("iso-8859-1"),
                           headers={"content-type": "application/json; charset=iso-8859-1"})
    assert latin.json()["delayMsg"]["msg"] == "café"
    bad_utf8 = await api.post(url, content='{"topic": "t", "msg": "café", "delayMillis": 0}'.encode("iso-8859-1"),
                              headers={"content-type": "application/json"})
    assert bad_utf8.json() == {"code": 400, "msg": "bad request: request body is not valid utf-8 (byte 26)"}


async def test_a_body_sent_in_several_asgi_messages_is_read_whole(api):
    body = b"topic=chunks&msg=" + b"x" * 5000 + b"&delayMillis=0"

    async def parts():  # httpx's ASGI transport sends each part as its own http.request message
        for part in (body[:7], body[7:3000], body[3000:]):
            yield part

    response = await api.post("/camellia/delayQueue/sendMsg", content=parts(),
                              headers={"content-type": "application/x-www-form-urlencoded",
                                       "content-length": str(len(body))})
    answer = response.json()
    assert answer["code"] == 200 and answer["delayMsg"]["msg"] == "x" * 5000


async def test_a_charset_that_is_no_text_encoding_is_400(api):
    # Python has codecs named rot13, hex and base64 (so Django takes them as a request's charset),
    # but bytes.decode refuses them with LookupError: this was code 500 "internal error: LookupError".
    cases = [(SEND, "application/x-www-form-urlencoded; charset=rot13", b"topic=t&msg=m&delayMillis=0", "rot13"),
             (SEND, "application/json; charset=hex", b'{"topic": "t", "msg": "m", "delayMillis": 0}', "hex"),
             ("/camellia/delayQueue/sendMsgBatch", "application/json; charset=base64", b'{"messages": []}', "base64")]
    for path, content_type, body, charset in cases:
        answer = await api.post(path, content=body, headers={"content-type": content_type})
        assert answer.json() == {"code": 400, "msg": f"charset {charset} is not a text encoding"}, content_type


async def test_a_multipart_body_with_too_many_files_is_400(api, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FILES = 2
    files = {f"f{i}": b"x" for i in range(3)}
    answer = await api.post(SEND, data={"topic": "t", "msg": "m", "delayMillis": "0"}, files=files)
    assert answer.json() == {"code": 400, "msg": "request has more than 2 files"}  # was 500 TooManyFilesSent


async def test_a_json_null_counts_as_an_absent_parameter(api):
    """As an empty form field does (README): a JSON client that writes every field, unset ones as null."""
    sent = (await api.post(SEND, json={"topic": "t", "msg": "m", "msgId": None, "delayMillis": 0, "triggerTime": None,
                                       "ttlMillis": None, "maxRetry": None, "priority": None})).json()
    assert sent["code"] == 200, sent
    assert len(sent["delayMsg"]["msgId"]) == 32  # generated
    assert sent["delayMsg"]["expireTime"] - sent["delayMsg"]["triggerTime"] == 3_600_000  # the default TTL
    missing = (await api.post(SEND, json={"topic": None, "msg": "m"})).json()
    assert missing["code"] == 400 and "topic" in missing["msg"]
    batch = (await api.post("/camellia/delayQueue/sendMsgBatch", json=[
        {"topic": "t", "msg": "m", "msgId": None, "delayMillis": 0, "ttlMillis": None, "maxRetry": None}])).json()
    [result] = batch["results"]
    assert result["code"] == 200, result
    assert len(result["delayMsg"]["msgId"]) == 32 and result["delayMsg"]["maxRetry"] == 10


async def test_a_parameter_given_twice_is_400_naming_it(api):
    """Which of two topics a client meant is a guess (Django keeps the last, Spring joins them with
    ","): refused, in a form body, a query string, a multipart body or one in each. camellia's SDK sends each
    parameter once, from a map."""
    repeated = [
        ("post", SEND, b"topic=a&msg=m&delayMillis=0&topic=b", FORM, "topic: given more than once in the request body"),
        ("post", SEND + "?topic=a&msg=m&delayMillis=0&msg=n", b"", {}, "msg: given more than once in the query string"),
        ("get", "/camellia/delayQueue/getTopicInfo?topic=a&topic=a", b"", {},
         "topic: given more than once in the query string"),
        ("post", "/camellia/delayQueue/ackMsgBatch", b"topic=a&msgIds=m1&msgIds=m2", FORM,
         "msgIds: given more than once in the request body"),
    ]
    both = "given in both the query string and the request body"
    repeated += [  # Spring would join the query string's value and the body's
        ("post", SEND + "?topic=a", b"topic=b&msg=m&delayMillis=0", FORM, f"topic: {both}"),
        ("post", SEND + "?msg=m", b'{"topic": "a", "msg": "m", "delayMillis": 0}', {"content-type": "application/json"},
         f"msg: {both}"),
    ]
    for method, url, body, headers, problem in repeated:
        answer = await api.request(method.upper(), url, content=body, headers=headers)
        assert answer.json() == {"code": 400, "msg": problem}, url
    multipart = await api.post(SEND, data={"topic": ["a", "b"], "msg": "m", "delayMillis": "0"}, files={"f": b"x"})
    assert multipart.json() == {"code": 400, "msg": "topic: given more than once in the request body"}
    json_bodies = [  # orjson keeps the last of a key given twice
        (SEND, b'{"topic": "a", "msg": "m", "delayMillis": 0, "topic": "b"}', "topic"),
        (SEND, b'{"topic":"a","msg":"{\\"k\\":1}","delayMillis":0,"msg":"x:y"}', "msg"),
        # A colon written as an escape, beside the key given twice: still found.
        (SEND, b'{"topic":"a\\u003ab","msg":"m","msg":"n","delayMillis":0}', "msg"),
        ("/camellia/delayQueue/sendMsgBatch", b'{"messages": [{"topic": "a", "msg": "m", "delayMillis": 0}, '
                                              b'{"topic": "a", "msg": "m", "delayMillis": 0, "delayMillis": 5}]}',
         "delayMillis"),
    ]
    for url, body, name in json_bodies:
        answer = await api.post(url, content=body, headers={"content-type": "application/json"})
        assert answer.json() == {"code": 400, "msg": f"{name}: given more than once in the request body"}, body
    assert (await api.get("/camellia/delayQueue/getTopicInfoList")).json()["data"] == []  # nothing sent
