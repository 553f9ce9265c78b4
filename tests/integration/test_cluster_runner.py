"""The script runner of a Redis Cluster (live/runners.DirectClusterScriptRunner): calls over
connections of its own to each primary, routed by redis-py's slot table, and redis-py's pipeline
where the table is out of date or a connection is lost."""
from redis.asyncio.cluster import RedisCluster

from delayqueue.live import scripts
from delayqueue.live.runners import DirectClusterScriptRunner, ScriptRunner
from delayqueue.services.send import SendRequest, send_messages
from tests.helpers import REDIS_CLUSTER_URL, make_runtime

TOPICS = [f"topic-{i}" for i in range(12)]  # their slots fall on all three masters


async def sent_everywhere(rt) -> list:
    return await send_messages(rt, requests=[SendRequest(topic, f"body of {topic}", delay_millis=60_000)
                                             for topic in TOPICS])


async def test_calls_to_every_master_come_back_in_order_as_redis_py_answers_them(clean_state):
    rt = make_runtime(REDIS_CLUSTER_URL)
    try:
        assert isinstance(rt.scripts, DirectClusterScriptRunner)
        sent = await sent_everywhere(rt)
        assert len({rt.redis.get_node_from_key(rt.ns.topic(m.topic).msgs).name for m in sent}) == 3
        calls = [scripts.get(rt.context, m.topic, msg_id=m.msg_id) for m in reversed(sent)]
        direct = await rt.scripts.run(calls)
        assert [m.payload for m in direct] == [f"body of {m.topic}" for m in reversed(sent)]
        assert direct == await ScriptRunner(rt.redis, rt.config.redis_timeout).run(calls)
    finally:
        await rt.close()


async def test_a_slot_table_out_of_date_is_read_again_and_the_calls_answered(clean_state):
    """A slot moved to another master (here: the table made wrong) answers MOVED: the calls go
    through redis-py's pipeline, and the table is read again."""
    rt = make_runtime(REDIS_CLUSTER_URL)
    try:
        sent = await sent_everywhere(rt)
        cluster: RedisCluster = rt.redis
        manager = cluster.nodes_manager
        primaries = cluster.get_primaries()
        right = {}
        for m in sent:  # every slot of these topics pointed at a master that does not serve it
            slot = cluster.keyslot(rt.ns.topic(m.topic).msgs)
            right[m.topic] = manager.slots_cache[slot][0].name
            manager.slots_cache[slot] = [next(node for node in primaries if node.name != right[m.topic])]
        replies = await rt.scripts.run([scripts.get(rt.context, m.topic, msg_id=m.msg_id) for m in sent])
        assert [m.msg_id for m in replies] == [m.msg_id for m in sent]
        assert {m.topic: cluster.get_node_from_key(rt.ns.topic(m.topic).msgs).name for m in sent} == right
    finally:
        await rt.close()


async def test_a_node_connection_lost_is_replaced_and_nothing_is_sent_twice(clean_state):
    rt = make_runtime(REDIS_CLUSTER_URL)
    try:
        first = await sent_everywhere(rt)
        for protocol in rt.scripts._nodes.values():  # as a node restart or a network cut would
            protocol.transport.abort()
        again = await sent_everywhere(rt)
        assert len(rt.scripts._nodes) == 3 and not any(protocol.lost for protocol in rt.scripts._nodes.values())
        assert len({m.msg_id for m in first + again}) == 2 * len(TOPICS)
        for m in first + again:
            key = rt.ns.topic(m.topic)
            assert await rt.redis.zscore(key.waiting, m.msg_id) == m.trigger_time
        assert [await rt.redis.zcard(rt.ns.topic(topic).waiting) for topic in TOPICS] == [2] * len(TOPICS)
    finally:
        await rt.close()
