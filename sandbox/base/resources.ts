/**
 * A running sandbox's resources: its metrics (cgroups, the writable layer's filesystem, its link's
 * counters) and live resizes of its memory and CPU limits, persisted in its state file (so a host
 * restart, a hibernate and a wake keep them).
 */
import { promises as fsp, readFileSync } from 'node:fs';
import { SandboxError } from '../../contract/errors';
import { SandboxCgroups } from '../proc-refs-and-cgroups';
import type { SandboxMetrics, ScaleRequest, ScaleResult } from '../host-contract/types';
import type { SandboxState } from './state-file';
import { sleep, type KeyedLock } from './common';

/** Where a provider's sandbox keeps what the cgroups do not count. */
export interface ResourceProbe {
  /** The writable layer's directory as the host reaches it (statfs of it: disk used and size); null: none. */
  upperDir: string | null;
  /** The host end of its link (/sys/class/net/<ifname>/statistics); null: no link. */
  ifname: string | null;
}

/** What the part needs from its provider. */
export interface ResourceDeps {
  lock: KeyedLock;
  stateOf(id: string): SandboxState;
  isLive(state: SandboxState): boolean;
  saveState(state: SandboxState): Promise<void>;
  probe(state: SandboxState): ResourceProbe;
}

/** A CPU reading kept for the next one's percentage. */
interface CpuSample {
  at: number;
  usageNs: number;
}

/** Readings older than this are not used for a percentage: the next call samples afresh. */
const SAMPLE_MAX_AGE_MS = 60_000;
/** The window of a fresh sample (a first call, or one after a long pause). */
const FRESH_WINDOW_MS = 100;
/** At most this many samples are kept (one per sandbox read). */
const MAX_SAMPLES = 10_000;
/** What the host keeps for itself when a sandbox grows (a resize never takes the host's last memory). */
const HOST_RESERVE_MB = 256;

const num = (text: string | null): number | null => {
  if (text === null) return null;
  const n = Number(text.trim());
  return Number.isFinite(n) ? n : null;
};

/** A `key value` field of a cgroup stat file (memory.stat, cpu.stat), or null. */
function statField(text: string | null, key: string): number | null {
  if (text === null) return null;
  const m = new RegExp(`^${key} (\\d+)$`, 'm').exec(text);
  return m ? Number(m[1]) : null;
}

/** A counter of a host interface, or null when it is not there. */
function netCounter(ifname: string | null, counter: string): number | null {
  if (!ifname || !/^[A-Za-z0-9_.-]{1,15}$/.test(ifname)) return null;
  try {
    return num(readFileSync(`/sys/class/net/${ifname}/statistics/${counter}`, 'utf8'));
  } catch {
    return null;
  }
}

/** The machine's memory now available (MemAvailable of /proc/meminfo), in MB; null when unknown. */
export function availableMemoryMB(meminfo?: string): number | null {
  let text = meminfo;
  if (text === undefined) {
    try {
      text = readFileSync('/proc/meminfo', 'utf8');
    } catch {
      return null;
    }
  }
  const m = /^MemAvailable:\s+(\d+) kB$/m.exec(text);
  return m ? Math.floor(Number(m[1]) / 1024) : null;
}

/** Metrics and resizes of running sandboxes (one per provider). */
export class SandboxResourceControl {
  private readonly samples = new Map<string, CpuSample>();

  constructor(private readonly deps: ResourceDeps) {}

  private running(id: string): SandboxState {
    const state = this.deps.stateOf(id);
    if (state.status !== 'running' || !this.deps.isLive(state)) throw new SandboxError('conflict', `sandbox ${id} is not running`);
    return state;
  }

  /**
   * The sandbox's metrics now. The CPU percentage covers the time since the previous reading of this
   * sandbox (at most a minute old); without one, a 100 ms window is sampled (`sample: false`: left null).
   * Throws not_found, or conflict when it is not running.
   */
  async metrics(id: string, opts: { sample?: boolean } = {}): Promise<SandboxMetrics> {
    const state = this.running(id);
    const cg = SandboxCgroups.of(id);
    const probe = this.deps.probe(state);
    const usageNs = () => num(cg.readCounter('cpuacct', 'cpuacct.usage'));
    let now = Date.now();
    let usage = usageNs();
    let prev = this.samples.get(id);
    if (prev && (now - prev.at > SAMPLE_MAX_AGE_MS || now - prev.at < 1)) prev = undefined;
    if (usage !== null && !prev && opts.sample !== false) {
      prev = { at: now, usageNs: usage };
      await sleep(FRESH_WINDOW_MS);
      now = Date.now();
      usage = usageNs();
    }
    let percent: number | null = null;
    let windowMs: number | null = null;
    if (usage !== null) {
      if (prev) {
        windowMs = now - prev.at;
        percent = windowMs > 0 ? Math.round(((usage - prev.usageNs) / 1e6 / windowMs) * 1000) / 10 : null;
      }
      if (this.samples.size >= MAX_SAMPLES) this.samples.clear();
      this.samples.set(id, { at: now, usageNs: usage });
    }
    const memStat = cg.readCounter('memory', 'memory.stat');
    const limitBytes = num(cg.readCounter('memory', 'memory.limit_in_bytes'));
    let disk: SandboxMetrics['disk'] = { usedBytes: null, limitBytes: null };
    if (probe.upperDir) {
      const st = await fsp.statfs(probe.upperDir).catch(() => null);
      if (st) disk = { usedBytes: (st.blocks - st.bfree) * st.bsize, limitBytes: st.blocks * st.bsize };
    }
    const pidsMax = cg.readCounter('pids', 'pids.max');
    const throttled = statField(cg.readCounter('cpu', 'cpu.stat'), 'throttled_time');
    return {
      timestamp: new Date(now).toISOString(),
      cpu: {
        count: state.limits.cpuCount ?? 0,
        usageSeconds: usage === null ? null : usage / 1e9,
        percent,
        windowMs,
        throttledSeconds: throttled === null ? null : throttled / 1e9,
      },
      memory: {
        usedBytes: num(cg.readCounter('memory', 'memory.usage_in_bytes')),
        // cgroup v1 answers a huge number for "no limit".
        limitBytes: limitBytes !== null && limitBytes < 2 ** 60 ? limitBytes : null,
        peakBytes: num(cg.readCounter('memory', 'memory.max_usage_in_bytes')),
        cacheBytes: statField(memStat, 'total_cache') ?? statField(memStat, 'cache'),
        oomKills: cg.oomKills(),
      },
      disk,
      // The host end's receive is what the sandbox sent, and the other way round.
      network: {
        rxBytes: netCounter(probe.ifname, 'tx_bytes'),
        txBytes: netCounter(probe.ifname, 'rx_bytes'),
        rxPackets: netCounter(probe.ifname, 'tx_packets'),
        txPackets: netCounter(probe.ifname, 'rx_packets'),
      },
      processes: { current: num(cg.readCounter('pids', 'pids.current')), limit: pidsMax?.trim() === 'max' ? null : num(pidsMax) },
    };
  }

  /** Forgets what was kept for a sandbox (it is gone). */
  drop(id: string): void {
    this.samples.delete(id);
  }

  /**
   * Applies new memory and CPU limits to a running sandbox's cgroups at once and saves them in its
   * state. A larger memory limit must fit in the machine's available memory (less a reserve):
   * unavailable otherwise. A smaller one below what the sandbox uses makes the kernel reclaim; when
   * it cannot, conflict, and nothing changes.
   */
  async scale(id: string, req: ScaleRequest): Promise<ScaleResult> {
    return this.deps.lock.run(id, async () => {
      const state = this.running(id);
      const cg = SandboxCgroups.of(id);
      const before = { memoryMB: state.limits.memoryMB, cpuCount: state.limits.cpuCount ?? 0 };
      if (req.memoryMB !== undefined && req.memoryMB !== before.memoryMB) {
        const growth = req.memoryMB - (before.memoryMB ?? 0);
        const available = availableMemoryMB();
        if (growth > 0 && available !== null && growth > available - HOST_RESERVE_MB) {
          throw new SandboxError(
            'unavailable',
            `sandbox ${id} cannot grow by ${growth} MB: its host has ${available} MB available (${HOST_RESERVE_MB} MB are kept for the host)`,
          );
        }
        try {
          await cg.setMemory(req.memoryMB);
        } catch (err) {
          const used = num(cg.readCounter('memory', 'memory.usage_in_bytes'));
          const usedMB = used === null ? '?' : Math.ceil(used / (1024 * 1024));
          if ((err as NodeJS.ErrnoException).code === 'EBUSY') {
            throw new SandboxError(
              'conflict',
              `sandbox ${id} uses ${usedMB} MB, which the kernel could not reclaim below ${req.memoryMB} MB; its limit is unchanged`,
            );
          }
          throw err;
        }
      }
      if (req.cpuCount !== undefined && req.cpuCount !== before.cpuCount) await cg.setCpu(req.cpuCount);
      state.limits = {
        ...state.limits,
        ...(req.memoryMB !== undefined ? { memoryMB: req.memoryMB } : {}),
        ...(req.cpuCount !== undefined ? { cpuCount: req.cpuCount } : {}),
      };
      await this.deps.saveState(state);
      return { memoryMB: state.limits.memoryMB ?? null, cpuCount: state.limits.cpuCount ?? 0 };
    });
  }
}
