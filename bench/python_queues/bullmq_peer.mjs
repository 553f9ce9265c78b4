// BullMQ's side of bench.python_queues: one mode per run, on the Redis in BENCH_BULLMQ_REDIS_URL
// (from the environment: the URL holds the password). Every mode but worker prints one JSON line.
//
//   node bullmq_peer.mjs enqueue QUEUE COUNT        sequential queue.add, then addBulk of 500
//   node bullmq_peer.mjs fill QUEUE COUNT           a backlog of no-op jobs, waiting (not timed)
//   node bullmq_peer.mjs worker QUEUE               a Worker (concurrency 50, no-op) until SIGTERM
//   node bullmq_peer.mjs lateness QUEUE RATE SECONDS LEAD_MS
//        a Worker, then RATE jobs a second due over SECONDS from LEAD_MS on, as delayed jobs;
//        prints each job's lateness (handler start - due, ms) once all ran
import { performance } from "node:perf_hooks";
import { Queue, Worker } from "bullmq";

const CONCURRENCY = 50;
const BULK = 500; // as the delayqueue producer's batches
// Kept jobs would pile up in the completed set: delayqueue and huey keep none in Redis either.
const JOB_OPTIONS = { removeOnComplete: true };

function connection() {
  const url = new URL(process.env.BENCH_BULLMQ_REDIS_URL);
  return {
    host: url.hostname, port: Number(url.port), password: decodeURIComponent(url.password) || undefined,
    db: Number(url.pathname.slice(1) || 0), maxRetriesPerRequest: null,
  };
}

const nowMs = () => performance.timeOrigin + performance.now();
const noopJobs = (count) => Array.from({ length: count }, (_, i) => ({ name: "noop", data: { i }, opts: JOB_OPTIONS }));

async function addBulk(queue, jobs) {
  for (let start = 0; start < jobs.length; start += BULK) {
    await queue.addBulk(jobs.slice(start, start + BULK));
  }
}

async function enqueue(queue, count) {
  let started = performance.now();
  for (let i = 0; i < count; i++) {
    await queue.add("noop", { i }, JOB_OPTIONS);
  }
  const add = count / ((performance.now() - started) / 1000);
  const jobs = noopJobs(count);
  started = performance.now();
  await addBulk(queue, jobs);
  const bulk = count / ((performance.now() - started) / 1000);
  console.log(JSON.stringify({ add, addBulk: bulk }));
}

function serve(name) {
  const worker = new Worker(name, async () => {}, { connection: connection(), concurrency: CONCURRENCY });
  const stop = async () => {
    await worker.close();
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

async function lateness(queue, name, rate, seconds, leadMs) {
  const count = rate * seconds;
  const late = [];
  let allIn;
  const done = new Promise((resolve) => { allIn = resolve; });
  const worker = new Worker(name, async (job) => {
    late.push(nowMs() - job.data.due);
    if (late.length >= count) allIn();
  }, { connection: connection(), concurrency: CONCURRENCY });
  await worker.waitUntilReady();
  const firstDue = nowMs() + leadMs;
  // Whole ms, as BullMQ schedules: a fractional due time would run up to half a ms early.
  const dues = Array.from({ length: count }, () => Math.round(firstDue + Math.random() * seconds * 1000));
  for (let start = 0; start < count; start += BULK) {
    const now = Date.now(); // BullMQ schedules at timestamp + delay: exactly each due ms
    await queue.addBulk(dues.slice(start, start + BULK).map((due) => (
      { name: "late", data: { due }, opts: { ...JOB_OPTIONS, timestamp: now, delay: Math.max(0, due - now) } })));
  }
  if (nowMs() > firstDue) throw new Error("the sends took longer than their lead: the figures would count them");
  await done;
  await worker.close();
  console.log(JSON.stringify({ lateness: late }));
}

const [mode, name, ...rest] = process.argv.slice(2);
const numbers = rest.map(Number);
if (mode === "worker") {
  serve(name);
} else {
  const queue = new Queue(name, { connection: connection() });
  if (mode === "enqueue") {
    await enqueue(queue, numbers[0]);
  } else if (mode === "fill") {
    await addBulk(queue, noopJobs(numbers[0]));
    console.log(JSON.stringify({ filled: numbers[0] }));
  } else if (mode === "lateness") {
    await lateness(queue, name, ...numbers);
  } else {
    throw new Error(`unknown mode ${mode}: enqueue, fill, worker or lateness`);
  }
  await queue.close();
}
