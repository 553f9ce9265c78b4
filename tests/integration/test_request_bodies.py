"""Request bodies over HTTP: the API turns bodies it cannot take into code 400 and honours the
charset a client names."""


async def test_too_many_form_fields_is_400(api, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 5
    body = "&".join(f"f{i}=x" for i in range(6)) + "&topic=t&msg=m&delayMillis=0"
    response = await api.post("/camellia/delayQueue/sendMsg", content=body.encode(),
                              headers={"content-type": "application/x-www-form-urlencoded"})
    assert response.status_code == 200
    assert response.json()["code"] == 400 and "more than 5 form fields" in response.json()["msg"]


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
    assert bad_utf8.json()["code"] == 400 and "JSON parse error" in bad_utf8.json()["msg"]


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
