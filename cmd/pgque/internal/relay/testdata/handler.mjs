// A test endpoint for pgque relay, in plain node:http (no packages).
//
// It answers every POST after a random latency and appends one JSON line
// per request start and end to the record file, in the order they happen
// in this single process, so the test can check per-key order and that no
// two requests of a key overlapped.
//
// Environment:
//   RECORD_FILE     where the lines go (required)
//   MAX_LATENCY_MS  latency is uniform in [0, MAX_LATENCY_MS] (default 20)
//   FAIL_EVERY      first deliveries of ev_ids divisible by it answer 500
//                   (default 0: never)
//   PORT            port to listen on (default 0: any); the chosen port is
//                   printed on stdout as {"port": N}
//
// A payload with "poison": true is answered 422 (dead-letter it).
import http from 'node:http';
import fs from 'node:fs';

const recordFile = process.env.RECORD_FILE;
if (!recordFile) {
  console.error('RECORD_FILE is required');
  process.exit(2);
}
const maxLatency = Number(process.env.MAX_LATENCY_MS ?? 20);
const failEvery = Number(process.env.FAIL_EVERY ?? 0);
const fd = fs.openSync(recordFile, 'a');
const inFlight = new Map(); // key -> ev_id of the request in flight

function record(obj) {
  fs.writeSync(fd, JSON.stringify(obj) + '\n');
}

const server = http.createServer((req, res) => {
  if (req.method !== 'POST') {
    res.writeHead(405).end();
    return;
  }
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const h = req.headers;
    // Absent header and pgque-partition-key-null: 1 mean the NULL key.
    const key = h['pgque-partition-key-null'] === '1' ? null : decodeURIComponent(h['pgque-partition-key'] ?? '');
    const ev = {
      ev_id: Number(h['pgque-ev-id']),
      key,
      epoch: Number(h['pgque-epoch']),
      slot: Number(h['pgque-slot']),
      retry: Number(h['pgque-retry-count']),
      ce_id: h['ce-id'],
      ce_type: h['ce-type'],
      ce_source: h['ce-source'],
      ce_time: h['ce-time'],
      ce_specversion: h['ce-specversion'],
      content_type: h['content-type'],
    };
    const kid = JSON.stringify(key);
    const overlap = inFlight.has(kid);
    inFlight.set(kid, ev.ev_id);
    record({ ph: 'start', ...ev, overlap });
    let body;
    try {
      body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    } catch {
      body = null;
    }
    let status = 200;
    if (body && body.poison === true) status = 422;
    else if (failEvery > 0 && ev.retry === 0 && ev.ev_id % failEvery === 0) status = 500;
    setTimeout(() => {
      if (inFlight.get(kid) === ev.ev_id) inFlight.delete(kid);
      record({ ph: 'end', ev_id: ev.ev_id, key, epoch: ev.epoch, status });
      res.writeHead(status, { 'content-type': 'text/plain' }).end(status === 200 ? 'ok' : 'no');
    }, Math.random() * maxLatency);
  });
});

server.keepAliveTimeout = 30000;
server.listen(Number(process.env.PORT ?? 0), '127.0.0.1', () => {
  process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n');
});
for (const sig of ['SIGTERM', 'SIGINT']) {
  process.on(sig, () => {
    fs.fsyncSync(fd);
    process.exit(0);
  });
}
