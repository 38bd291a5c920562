// With gatherReceives, the receives of slots woken together are made as
// one call: a tick wakes the slots it touched at once, and each makes its
// own receive (one round trip, one transaction, one commit per slot). The
// call serves its slots one after another, so the last one's chunk waits
// for the others': less CPU for more latency, which is why it is an option. The receives a wake-up
// starts run in one turn of the event loop; they are gathered until the
// loop's next check phase (setImmediate), which adds no wait, and sent as
// one receive_partitioned_raw_slots call (design.md, "One call for the
// slots a tick wakes"; the Go pool's gather.go does the same). A slot receiving chunk after chunk does not come
// here: its receives go out at once, in parallel with the other slots'.

import { msColumn, type Executor } from "../executor.js";
import type { ChunkRow } from "./message.js";
import * as q from "./sql.js";

interface Pending {
  slot: number;
  nslots: number;
  token: string;
  ack: q.Delivery | null;
  resolve: (rows: ChunkRow[]) => void;
  reject: (err: unknown) => void;
}

type SlotRow = ChunkRow & { slot: number; nslots: number };

/** Slots to one call at most: receive_partitioned_raw_slots takes up to 1024. */
const gatherMostPerCall = 1024;

export class ReceiveGather {
  private pending: Pending[] = [];
  private scheduled = false;
  /** Set when the server has no receive_partitioned_raw_slots (an older install): every slot then receives alone. */
  private off = false;
  /** Calls made for more than one slot. */
  calls = 0;

  constructor(
    private readonly db: Executor,
    private readonly queue: string,
    private readonly consumer: string,
    private readonly worker: string,
    private readonly max: number,
  ) {}

  /** The slot's next chunk, acknowledging ack first, in a call shared with the other slots that ask in this turn. */
  receive(slot: number, nslots: number, token: string, ack: q.Delivery | null): Promise<ChunkRow[]> {
    if (this.off) return q.receive(this.db, this.queue, this.consumer, slot, nslots, this.worker, token, this.max, ack);
    return new Promise((resolve, reject) => {
      this.pending.push({ slot, nslots, token, ack, resolve, reject });
      if (!this.scheduled) {
        this.scheduled = true;
        setImmediate(() => this.flush());
      }
    });
  }

  private flush(): void {
    const batch = this.pending;
    this.pending = [];
    this.scheduled = false;
    const parts = Math.ceil(batch.length / gatherMostPerCall);
    for (let i = 0; i < parts; i++) {
      void this.call(batch.slice(Math.floor((i * batch.length) / parts), Math.floor(((i + 1) * batch.length) / parts)));
    }
  }

  private async alone(p: Pending): Promise<void> {
    try {
      p.resolve(await q.receive(this.db, this.queue, this.consumer, p.slot, p.nslots, this.worker, p.token, this.max, p.ack));
    } catch (err) {
      p.reject(err);
    }
  }

  private async call(batch: Pending[]): Promise<void> {
    if (batch.length === 1) return this.alone(batch[0]!);
    this.calls++;
    let rows: SlotRow[];
    try {
      ({ rows } = await this.db.query<SlotRow>(
        `select msg_id, batch_id, type, payload, retry_count, ${msColumn("created_at", "created_ms")}, partition_key, epoch, slot, nslots
           from pgque.receive_partitioned_raw_slots($1::text, $2::text, $3::text, $4::int, $5::int[], $6::int[], $7::uuid[], $8::bigint[], $9::bigint[], $10::bigint[])`,
        [this.queue, this.consumer, this.worker, this.max, batch.map((p) => p.slot), batch.map((p) => p.nslots), batch.map((p) => p.token),
          batch.map((p) => p.ack?.epoch ?? null), batch.map((p) => p.ack?.batchId ?? null), batch.map((p) => p.ack?.msgId ?? null)],
      ));
    } catch (err) {
      // All or nothing: one slot's failure (its lease lost, say) left
      // everything as it was. Each slot asks alone and learns its own answer.
      if ((err as { code?: string }).code === "42883") this.off = true;
      await Promise.all(batch.map((p) => this.alone(p)));
      return;
    }
    const chunks = new Map<string, ChunkRow[]>();
    for (const r of rows) {
      const k = `${r.slot}/${r.nslots}`;
      let c = chunks.get(k);
      if (!c) chunks.set(k, (c = []));
      c.push(r);
    }
    for (const p of batch) p.resolve(chunks.get(`${p.slot}/${p.nslots}`) ?? []);
  }
}
