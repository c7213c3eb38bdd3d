'use strict';
// A flash-sale checkout written the way the incident's was, with no stocksentry code in
// it: a read-then-write of the stock, guarded (or not) by a Redis lock. The sidecar
// watches it from outside: database probes, the Redis lock watcher, and (METRICS=contract)
// the contract's metrics emitted with prom-client. Logs are JSON lines on stdout with the
// stock_check / stock_update events that `stocksentry timeline` reads, and (naive) the
// lock_acquired / lock_released events that say whose lock each DEL removed.
//
// Environment: PORT, DATABASE_URL, REDIS_URL, STRATEGY (naive | redlock | unlocked),
// LOCK_TTL_S (naive: SET NX EX seconds; redlock: TTL too), WORK_MS (time spent between the
// read and the write), METRICS (contract | wrong | off).
//
// POST /checkout?sku=EGG-01&request_id=R1 -> 200 {"ok":true,...} or 409 {"reason":...}
// GET /metrics -> the prom-client registry.

const http = require('node:http');
const crypto = require('node:crypto');
const { Pool } = require('pg');
const Redis = require('ioredis');
const Redlock = require('redlock');
const client = require('prom-client');

const env = process.env;
const PORT = Number(env.PORT || 3000);
const STRATEGY = env.STRATEGY || 'naive';
const LOCK_TTL_S = Number(env.LOCK_TTL_S || 5);
const WORK_MS = Number(env.WORK_MS || 6000);
const METRICS = env.METRICS || 'off';

const db = new Pool({ connectionString: env.DATABASE_URL, max: 20 });
const redis = new Redis(env.REDIS_URL || 'redis://127.0.0.1:6379/0', { maxRetriesPerRequest: 2 });
const redlock = new Redlock([redis], { retryCount: 200, retryDelay: 50, retryJitter: 50 });

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function log(event, fields) {
  process.stdout.write(
    JSON.stringify({ timestamp: new Date().toISOString(), level: 'info', event, ...fields }) + '\n',
  );
}

// --- metrics: the contract's names, types, labels and buckets (docs/other-languages.md) ---
const registry = new client.Registry();
const LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];
// The series both variants share: success, conflict and duration as the contract has them.
function reservationMetrics() {
  return {
    success: new client.Counter({
      name: 'stock_reservation_success_total',
      help: 'Stock reservations that succeeded.',
      labelNames: ['sku', 'strategy'],
      registers: [registry],
    }),
    conflict: new client.Counter({
      name: 'stock_reservation_conflict_total',
      help: 'Stock reservations refused by a conflict.',
      labelNames: ['sku', 'reason'],
      registers: [registry],
    }),
    duration: new client.Histogram({
      name: 'stock_reservation_duration_seconds',
      help: 'Duration of stock reservations by outcome.',
      labelNames: ['outcome'],
      buckets: LATENCY_BUCKETS,
      registers: [registry],
    }),
  };
}
const PAID = {
  name: 'stock_orders_paid_total',
  help: 'Orders confirmed as paid.',
  labelNames: ['sku'],
  registers: [registry],
};
let metrics = null;
if (METRICS === 'contract') {
  metrics = { ...reservationMetrics(), paid: new client.Counter(PAID) };
} else if (METRICS === 'wrong') {
  // Deliberately off the contract: paid orders as a gauge, a conflict reason of its own.
  metrics = { ...reservationMetrics(), paid: new client.Gauge(PAID), wrongReason: true };
}

function record(sku, outcome, seconds) {
  if (!metrics) return;
  metrics.duration.labels(outcome).observe(seconds);
  if (outcome === 'success') {
    metrics.success.labels(sku, STRATEGY).inc();
    metrics.paid.labels(sku).inc();
  } else {
    metrics.conflict.labels(sku, metrics.wrongReason ? 'sold_out' : outcome).inc();
  }
}

// --- the checkout: read, work, write (the bug is that the write is not conditional) -------
async function readThenWrite(sku, requestId) {
  const read = await db.query('SELECT id, available_stock FROM products WHERE sku = $1', [sku]);
  if (read.rows.length === 0) return { ok: false, reason: 'out_of_stock' };
  const { id, available_stock: available } = read.rows[0];
  log('stock_check', { sku, strategy: STRATEGY, available, request_id: requestId });
  await sleep(WORK_MS); // payment authorisation, fraud check ... inside the critical section
  if (available < 1) {
    log('stock_update', { sku, strategy: STRATEGY, qty: 1, success: false, reason: 'out_of_stock', request_id: requestId });
    return { ok: false, reason: 'out_of_stock' };
  }
  const to = available - 1;
  await db.query('UPDATE products SET available_stock = $1 WHERE id = $2', [to, id]);
  const order = await db.query(
    "INSERT INTO orders (status, external_ref) VALUES ('PAID', $1) RETURNING id",
    [requestId],
  );
  await db.query('INSERT INTO order_items (order_id, product_id, quantity) VALUES ($1, $2, 1)', [
    order.rows[0].id,
    id,
  ]);
  log('stock_update', {
    sku, strategy: STRATEGY, qty: 1, success: true, from: available, to, request_id: requestId,
    order_id: String(order.rows[0].id),
  });
  return { ok: true, order_id: order.rows[0].id };
}

async function naive(sku, requestId) {
  const key = `lock:product:${sku}`;
  const token = crypto.randomUUID();
  const deadline = Date.now() + 30000;
  // SET NX EX: a lease of LOCK_TTL_S seconds, retried until it is free.
  while ((await redis.set(key, token, 'EX', LOCK_TTL_S, 'NX')) !== 'OK') {
    if (Date.now() > deadline) return { ok: false, reason: 'lock_not_acquired' };
    await sleep(20 + Math.random() * 30);
  }
  log('lock_acquired', { sku, token, request_id: requestId });
  try {
    return await readThenWrite(sku, requestId);
  } finally {
    // The bug: DEL deletes whoever holds the lock now. The GET in the same MULTI changes
    // nothing Redis notifies (one `del`, as a plain DEL); it only lets the log say whose
    // lock went, the truth the tests compare the sidecar's counts with.
    const [[, held]] = await redis.multi().get(key).del(key).exec();
    log('lock_released', {
      sku, token, request_id: requestId, deleted: held, deleted_other: held !== null && held !== token,
    });
  }
}

async function withRedlock(sku, requestId) {
  const ttl = LOCK_TTL_S * 1000;
  let lock;
  try {
    lock = await redlock.lock(`lock:product:${sku}`, ttl);
  } catch (err) {
    return { ok: false, reason: 'lock_not_acquired' };
  }
  // Extend the owned lease while the work runs, so it never expires under the holder.
  let extending = Promise.resolve();
  const timer = setInterval(() => {
    extending = extending.then(async () => {
      lock = await lock.extend(ttl);
    }).catch(() => {});
  }, Math.max(ttl / 3, 50));
  try {
    return await readThenWrite(sku, requestId);
  } finally {
    clearInterval(timer);
    await extending;
    await lock.unlock().catch(() => {}); // deletes only if the token is still ours
  }
}

async function checkout(sku, requestId) {
  if (STRATEGY === 'naive') return naive(sku, requestId);
  if (STRATEGY === 'redlock') return withRedlock(sku, requestId);
  return readThenWrite(sku, requestId);
}

const server = http.createServer(async (req, res) => {
  const url = new URL(req.url, 'http://localhost');
  try {
    if (req.method === 'GET' && url.pathname === '/metrics') {
      res.writeHead(200, { 'Content-Type': registry.contentType });
      res.end(await registry.metrics());
      return;
    }
    if (req.method === 'GET' && url.pathname === '/healthz') {
      res.writeHead(200).end('ok');
      return;
    }
    if (req.method === 'POST' && url.pathname === '/checkout') {
      const sku = url.searchParams.get('sku') || '';
      const requestId = url.searchParams.get('request_id') || crypto.randomUUID();
      const started = process.hrtime.bigint();
      const result = await checkout(sku, requestId);
      const seconds = Number(process.hrtime.bigint() - started) / 1e9;
      record(sku, result.ok ? 'success' : result.reason, seconds);
      res.writeHead(result.ok ? 200 : 409, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify(result));
      return;
    }
    res.writeHead(404).end();
  } catch (err) {
    record(url.searchParams.get('sku') || '', 'error', 0);
    process.stderr.write(`checkout error: ${err && err.stack ? err.stack : err}\n`);
    res.writeHead(500).end();
  }
});

server.listen(PORT, '127.0.0.1', () => {
  process.stderr.write(`listening on 127.0.0.1:${PORT} strategy=${STRATEGY}\n`);
});

function shutdown() {
  server.close();
  Promise.allSettled([db.end(), redis.quit()]).then(() => process.exit(0));
  setTimeout(() => process.exit(0), 2000).unref();
}
process.on('SIGTERM', shutdown);
process.on('SIGINT', shutdown);
