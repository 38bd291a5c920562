// One claim pass's plan, the Go pool's makePlan (internal/workerpool) in
// TypeScript: both sides must compute the same fair share from the same
// facts, or a mixed consumer group would not converge.
//
//   - Live workers are the owners of unexpired leases, the peers that
//     announced themselves recently, and this worker. The fair share is
//     ceil(N / live), capped at maxActive.
//   - Slots the server says this worker owns but no runner works (re-taken
//     after a fencing) are adopted first.
//   - Free slots are claimed up to the fair share, in random order so that
//     workers starting together do not race for the same slot.
//   - Beyond the fair share a free slot is claimed, up to maxActive, only
//     when it stayed free for a whole pass and nobody is hungry.
//   - A worker above its fair share releases the excess while a peer is
//     hungry (highest slots first, as Go does).
//   - A worker that stops gracefully announces no slots and no hunger
//     last (left): its peers stop counting it at once.

/**
 * Whether an announcement is that of a worker that stopped gracefully (its
 * last one: no slots, not hungry). A running worker never makes it: its
 * fair share is at least one slot, so it is hungry while it has none. Its
 * peers drop it at once and take its released slots on their next pass,
 * as the Go pool does (internal/workerpool, left).
 */
export function left(p: { hungry: boolean; slots: readonly number[] }): boolean {
  return p.slots.length === 0 && !p.hungry;
}

export interface PlanInput {
  self: string;
  slots: number;
  maxActive: number;
  /** Owner per slot when its lease is live, null when the slot is free. */
  owners: (string | null)[];
  /** Slots this worker runs, mapped to whether a release was asked already. */
  running: Map<number, boolean>;
  /** Live announced peers (not self) and whether each is hungry. */
  peers: Map<string, boolean>;
  /** Slots recently released for a hungry peer: not taken back yet. */
  holdoff: Set<number>;
  /** Slots the previous pass saw free. */
  prevFree: Set<number>;
}

export interface Plan {
  live: number;
  target: number;
  claim: number[];
  release: number[];
  free: Set<number>;
}

export function makePlan(inp: PlanInput, random: () => number = Math.random): Plan {
  const live = new Set<string>([inp.self]);
  for (const o of inp.owners) if (o !== null) live.add(o);
  let othersHungry = false;
  for (const [w, hungry] of inp.peers) {
    live.add(w);
    othersHungry ||= hungry;
  }
  const target = Math.min(Math.ceil(inp.slots / live.size), inp.maxActive);
  const plan: Plan = { live: live.size, target, claim: [], release: [], free: new Set() };

  const adopt: number[] = [];
  const free: number[] = [];
  inp.owners.forEach((owner, slot) => {
    if (inp.running.has(slot)) return;
    if (owner === inp.self) adopt.push(slot);
    else if (owner === null) {
      plan.free.add(slot);
      if (!inp.holdoff.has(slot)) free.push(slot);
    }
  });
  for (let i = free.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [free[i], free[j]] = [free[j]!, free[i]!];
  }

  let mine = inp.running.size;
  for (const s of adopt) {
    if (mine >= inp.maxActive) break;
    plan.claim.push(s);
    mine++;
  }
  for (const s of free) {
    if (mine >= inp.maxActive) break;
    if (mine >= target && (othersHungry || !inp.prevFree.has(s))) continue;
    plan.claim.push(s);
    mine++;
  }

  if (othersHungry) {
    const candidates = [...inp.running].filter(([, releasing]) => !releasing).map(([s]) => s).sort((a, b) => b - a);
    let keep = candidates.length;
    for (let i = 0; keep > target && i < candidates.length; i++) {
      plan.release.push(candidates[i]!);
      keep--;
    }
  }
  return plan;
}

/**
 * The gate of one kind of presence NOTIFY (a peer's hint, a peer's leave):
 * take() runs fire at once when the last run was gapMs ago or more, and
 * otherwise once when the gap ends, however many take() come meanwhile. A
 * forged flood thus costs one early claim pass per gap, and a real hint
 * that came within the gap (a worker hears its own after every pass) is
 * late by the rest of the gap rather than dropped.
 */
export class HintGate {
  private last = -Infinity;
  private later: NodeJS.Timeout | null = null;

  constructor(private readonly gapMs: number, private readonly fire: () => void) {}

  take(): void {
    const wait = this.last + this.gapMs - Date.now();
    if (wait > 0) {
      if (this.later === null) {
        this.later = setTimeout(() => {
          this.later = null;
          this.take();
        }, wait);
        this.later.unref();
      }
      return;
    }
    this.last = Date.now();
    this.fire();
  }

  /** Drops the run due when the gap ends, if any. */
  stop(): void {
    if (this.later !== null) clearTimeout(this.later);
    this.later = null;
  }
}
