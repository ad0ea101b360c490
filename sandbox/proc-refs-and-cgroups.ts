/**
 * Process and cgroup helpers: identify a process by pid + start time (so a recycled pid is never
 * mistaken for ours), per-sandbox cgroup v1 groups for limits and for killing every process of a sandbox.
 */
import { promises as fsp, readFileSync } from 'node:fs';
import * as path from 'node:path';
import { mkdirNow, renameNow, writeSmall } from './quick-fs';

/** A process recorded in a sandbox's state: pid plus its start time in clock ticks since boot. */
export interface ProcRef {
  pid: number;
  start: number;
}

function parseStat(text: string): { state: string; start: number } | null {
  // The command name (field 2) may contain spaces and parentheses: parse after the last ')'.
  const close = text.lastIndexOf(')');
  if (close < 0) return null;
  const fields = text.slice(close + 2).split(' ');
  // fields[0] is field 3 (state); starttime is field 22 → index 19.
  return { state: fields[0], start: Number(fields[19]) };
}

/** Start time of a live (non-zombie) process, or null when it is gone. */
export function procStart(pid: number): number | null {
  try {
    const st = parseStat(readFileSync(`/proc/${pid}/stat`, 'utf8'));
    if (!st || st.state === 'Z' || st.state === 'X') return null;
    return st.start;
  } catch {
    return null;
  }
}

/** A ProcRef for a pid that was just started; null when it already exited. */
export function procRef(pid: number | undefined): ProcRef | null {
  if (!pid) return null;
  const start = procStart(pid);
  return start === null ? null : { pid, start };
}

/** True when the recorded process is still the same live process. */
export function isAlive(ref: ProcRef | undefined | null): boolean {
  if (!ref) return false;
  return procStart(ref.pid) === ref.start;
}

/** Sends a signal to the recorded process if it is still alive; never throws. */
export function signalRef(ref: ProcRef | undefined | null, signal: NodeJS.Signals | number): void {
  if (ref && isAlive(ref)) {
    try {
      process.kill(ref.pid, signal);
    } catch {
      /* already gone */
    }
  }
}

const CGROUP_ROOT = '/sys/fs/cgroup';
// cpuacct is a hierarchy of its own here (cgroup v1): it counts the sandbox's CPU time (metrics).
const CONTROLLERS = ['memory', 'pids', 'cpu', 'cpuacct', 'freezer'] as const;
type Controller = (typeof CONTROLLERS)[number];

/** Resource limits of a sandbox, applied where the controllers exist. */
export interface Limits {
  memoryMB?: number;
  cpuCount?: number;
  maxProcesses: number;
  /** Size of the writable layer (a tmpfs, see tools/sandbox-init); not a cgroup limit. */
  diskMB?: number;
}

/** Per-sandbox cgroups under `/sys/fs/cgroup/<controller>/sap/<id>`, for the controllers available. */
export class SandboxCgroups {
  private constructor(readonly dirs: Partial<Record<Controller, string>>) {}

  /** The cgroups of a sandbox as they would be named (whether they exist or not). */
  static of(id: string, root = CGROUP_ROOT): SandboxCgroups {
    const dirs: Partial<Record<Controller, string>> = {};
    for (const c of CONTROLLERS) dirs[c] = path.join(root, c, 'sap', id);
    return new SandboxCgroups(dirs);
  }

  /** Creates the groups and applies the limits; a controller that is missing or not writable is skipped. (cgroupfs: see ./quick-fs.) */
  static create(id: string, limits: Limits, root = CGROUP_ROOT): SandboxCgroups {
    const dirs: Partial<Record<Controller, string>> = {};
    for (const c of CONTROLLERS) {
      const dir = path.join(root, c, 'sap', id);
      try {
        mkdirNow(dir, 0o755, true);
        writeLimitsNow(c, dir, limits);
        dirs[c] = dir;
      } catch {
        /* controller not available here */
      }
    }
    return new SandboxCgroups(dirs);
  }

  /** Removes the empty groups under `sap/` whose name `match` accepts (a group still in use stays). */
  static async removeGroups(match: (name: string) => boolean, root = CGROUP_ROOT): Promise<void> {
    await Promise.all(
      CONTROLLERS.map(async (c) => {
        const names = await fsp.readdir(path.join(root, c, 'sap')).catch(() => [] as string[]);
        await Promise.all(names.filter(match).map((n) => fsp.rmdir(path.join(root, c, 'sap', n)).catch(() => undefined)));
      }),
    );
  }

  /** Writes the limits into the existing groups of a sandbox not yet running anything. Throws when one cannot be written. */
  applyLimits(limits: Limits): void {
    for (const [c, dir] of Object.entries(this.dirs)) writeLimitsNow(c as Controller, dir as string, limits);
  }

  /**
   * Gives the groups the names of sandbox `id` (cgroup v1 renames a group, with its processes, within
   * its parent) and returns them under those names. Throws when a rename fails.
   */
  renameTo(id: string): SandboxCgroups {
    const dirs: Partial<Record<Controller, string>> = {};
    for (const [c, dir] of Object.entries(this.dirs)) {
      const to = path.join(path.dirname(dir as string), id);
      renameNow(dir as string, to);
      dirs[c as Controller] = to;
    }
    return new SandboxCgroups(dirs);
  }

  /** The `cgroup.procs` files a process writes its pid into to join the sandbox's groups. */
  procsFiles(): string[] {
    return Object.values(this.dirs).map((d) => path.join(d as string, 'cgroup.procs'));
  }

  /**
   * Pids currently in the groups. Every process of a sandbox joins all of its groups, so one group
   * tells (the pids controller's where there is one). Read synchronously: cgroupfs never waits.
   */
  async pids(): Promise<number[]> {
    const dir = this.dirs.pids ?? Object.values(this.dirs)[0];
    if (!dir) return [];
    let text: string;
    try {
      text = readFileSync(path.join(dir, 'cgroup.procs'), 'utf8');
    } catch {
      return [];
    }
    return text.split('\n').filter(Boolean).map(Number);
  }

  /**
   * How many processes the kernel's OOM killer has killed in the sandbox's memory group so far
   * (`oom_kill` of memory.oom_control); 0 without a memory controller.
   */
  oomKills(): number {
    if (!this.dirs.memory) return 0;
    try {
      const m = /^oom_kill (\d+)$/m.exec(readFileSync(path.join(this.dirs.memory, 'memory.oom_control'), 'utf8'));
      return m ? Number(m[1]) : 0;
    } catch {
      return 0;
    }
  }

  /**
   * What the sandbox's groups count now (see ./resources for the reading); a missing controller
   * or file reads as null.
   */
  readCounter(c: Controller, file: string): string | null {
    const dir = this.dirs[c];
    if (!dir) return null;
    try {
      return readFileSync(path.join(dir, file), 'utf8');
    } catch {
      return null;
    }
  }

  /**
   * Sets the memory limit of a running sandbox. Below what it uses, the kernel reclaims (page cache,
   * tmpfs to swap if any) and, when it cannot, refuses the write (EBUSY): that error is thrown.
   */
  async setMemory(memoryMB: number): Promise<void> {
    if (this.dirs.memory) await writeLimits('memory', this.dirs.memory, { memoryMB, maxProcesses: 0 });
  }

  /** Sets the CFS quota of a running sandbox (0: no quota). */
  async setCpu(cpuCount: number): Promise<void> {
    if (!this.dirs.cpu) return;
    if (cpuCount > 0) await writeLimits('cpu', this.dirs.cpu, { cpuCount, maxProcesses: 0 });
    else await fsp.writeFile(path.join(this.dirs.cpu, 'cpu.cfs_quota_us'), '-1');
  }

  private freeze(state: 'FROZEN' | 'THAWED'): void {
    if (!this.dirs.freezer) return;
    try {
      writeSmall(path.join(this.dirs.freezer, 'freezer.state'), state);
    } catch {
      /* absent */
    }
  }

  /** Freezes the sandbox's processes (e.g. for a consistent copy of its writable layer). */
  pause(): void {
    this.freeze('FROZEN');
  }

  /** Thaws the sandbox's processes. */
  resume(): void {
    this.freeze('THAWED');
  }

  /** SIGKILLs every process in the groups (freezing first so none can fork away) and waits until they are gone. */
  async killAll(timeoutMs = 3000): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const pids = await this.pids();
      if (pids.length === 0) return true;
      if (Date.now() > deadline) return false;
      this.freeze('FROZEN');
      for (const pid of await this.pids()) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          /* gone */
        }
      }
      this.freeze('THAWED');
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  /** Removes the groups (they must be empty). */
  async remove(): Promise<void> {
    let left = Object.values(this.dirs) as string[];
    for (let i = 0; i < 50 && left.length; i++) {
      if (i > 0) await new Promise((r) => setTimeout(r, 10));
      const busy = await Promise.all(
        left.map((dir) =>
          fsp.rmdir(dir).then(
            () => false,
            (err: NodeJS.ErrnoException) => err.code === 'EBUSY',
          ),
        ),
      );
      left = left.filter((_, i) => busy[i]);
    }
  }
}

/** writeLimits, synchronously: for groups whose sandbox runs nothing yet (no reclaim to wait for; see ./quick-fs). */
function writeLimitsNow(c: Controller, dir: string, limits: Limits): void {
  if (c === 'memory' && limits.memoryMB) writeSmall(path.join(dir, 'memory.limit_in_bytes'), String(Math.floor(limits.memoryMB * 1024 * 1024)));
  if (c === 'pids') writeSmall(path.join(dir, 'pids.max'), String(limits.maxProcesses));
  if (c === 'cpu' && limits.cpuCount) {
    writeSmall(path.join(dir, 'cpu.cfs_period_us'), '100000');
    writeSmall(path.join(dir, 'cpu.cfs_quota_us'), String(Math.max(1000, Math.round(limits.cpuCount * 100000))));
  }
}

/** Writes a controller's limits (memory, processes, CPU) into a group directory. */
async function writeLimits(c: Controller, dir: string, limits: Limits): Promise<void> {
  if (c === 'memory' && limits.memoryMB) {
    await fsp.writeFile(path.join(dir, 'memory.limit_in_bytes'), String(Math.floor(limits.memoryMB * 1024 * 1024)));
  }
  if (c === 'pids') await fsp.writeFile(path.join(dir, 'pids.max'), String(limits.maxProcesses));
  if (c === 'cpu' && limits.cpuCount) {
    await fsp.writeFile(path.join(dir, 'cpu.cfs_period_us'), '100000');
    await fsp.writeFile(path.join(dir, 'cpu.cfs_quota_us'), String(Math.max(1000, Math.round(limits.cpuCount * 100000))));
  }
}
