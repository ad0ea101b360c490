/**
 * Sandbox resource limits: the defaults every sandbox gets and the operator's maxima, from the
 * environment. One module for the API (config/index.ts), the worker and the sandbox host
 * (sandbox/host/main.ts), so that the defaults exist once.
 *
 * | variable               | default                                   |
 * |------------------------|-------------------------------------------|
 * | SANDBOX_MEMORY_MB      | 2048 (at most SANDBOX_MAX_MEMORY_MB)       |
 * | SANDBOX_DISK_MB        | 20480 (at most SANDBOX_MAX_DISK_MB)        |
 * | SANDBOX_CPU_COUNT      | 0: no CFS quota, an equal cpu.shares weight |
 * | SANDBOX_MAX_PROCESSES  | 512                                       |
 * | SANDBOX_MAX_MEMORY_MB  | the machine's total memory, in MB         |
 * | SANDBOX_MAX_DISK_MB    | 20480                                     |
 * | SANDBOX_MAX_CPU_COUNT  | the number of cores                       |
 *
 * The writable layer is an ext4 image per sandbox on the host's storage (sparse: it costs what is
 * written; see docs/disk.md), so the disk default no longer follows the memory default.
 */
import * as os from 'node:os';
import { z } from 'zod';
import { MIN_MEMORY_MB } from '../contract/limits';

export const DEFAULT_MEMORY_MB = 2048;
export const DEFAULT_MAX_PROCESSES = 512;
export const DEFAULT_MAX_DISK_MB = 20480;
export const DEFAULT_DISK_MB = 20480;
export { MIN_MEMORY_MB };

/** The effective limits of one sandbox (what its host applies). */
export interface SandboxResources {
  memoryMB: number;
  diskMB: number;
  /** CPUs of CFS quota; 0 = no quota (an equal cpu.shares weight). */
  cpuCount: number;
  maxProcesses: number;
}

/** Defaults and operator maxima. */
export interface SandboxLimits extends SandboxResources {
  maxMemoryMB: number;
  maxDiskMB: number;
  maxCpuCount: number;
}

/** A caller's overrides (per agent or per sandbox). */
export type LimitOverrides = Partial<Pick<SandboxResources, 'memoryMB' | 'diskMB' | 'cpuCount' | 'maxProcesses'>>;

const megabytes = (min: number) =>
  z.coerce
    .number()
    .int()
    .min(min)
    .max(1024 * 1024 * 1024);
const cpus = z.coerce.number().min(0).max(4096);

/** The variables, as zod fields: spread into each process's environment schema. */
export const limitsEnvShape = {
  SANDBOX_MEMORY_MB: megabytes(MIN_MEMORY_MB).optional(),
  SANDBOX_DISK_MB: megabytes(1).optional(),
  SANDBOX_CPU_COUNT: cpus.optional(),
  SANDBOX_MAX_PROCESSES: z.coerce.number().int().min(1).max(4194304).optional(),
  SANDBOX_MAX_MEMORY_MB: megabytes(MIN_MEMORY_MB).optional(),
  SANDBOX_MAX_DISK_MB: megabytes(1).optional(),
  SANDBOX_MAX_CPU_COUNT: cpus.refine((n) => n > 0, 'must be positive').optional(),
};

export type LimitsEnv = { [K in keyof typeof limitsEnvShape]?: number };

/** What the machine has, for the maxima's defaults (a parameter so tests can pretend). */
export interface Machine {
  totalMemoryMB: number;
  cores: number;
}

export function thisMachine(): Machine {
  return {
    totalMemoryMB: Math.floor(os.totalmem() / (1024 * 1024)),
    cores: typeof os.availableParallelism === 'function' ? os.availableParallelism() : os.cpus().length,
  };
}

/** A problem with the variables, named as `VARIABLE: message` like the rest of the configuration. */
export interface LimitsIssue {
  variable: keyof typeof limitsEnvShape;
  message: string;
}

/**
 * The limits from parsed variables (absent ones take their defaults). An explicit default above its
 * maximum is an issue; an implicit one (2048 MB on a smaller machine) is lowered to the maximum.
 */
export function resolveLimits(env: LimitsEnv, machine: Machine = thisMachine()): { limits: SandboxLimits; issues: LimitsIssue[] } {
  const issues: LimitsIssue[] = [];
  const maxMemoryMB = env.SANDBOX_MAX_MEMORY_MB ?? Math.max(MIN_MEMORY_MB, machine.totalMemoryMB);
  const maxDiskMB = env.SANDBOX_MAX_DISK_MB ?? DEFAULT_MAX_DISK_MB;
  const maxCpuCount = env.SANDBOX_MAX_CPU_COUNT ?? Math.max(1, machine.cores);
  const pick = (variable: LimitsIssue['variable'], given: number | undefined, fallback: number, max: number, maxName: string, unit: string): number => {
    if (given === undefined) return Math.min(fallback, max);
    if (given > max) issues.push({ variable, message: `${given} is above ${maxName} (${max}${unit})` });
    return given;
  };
  const memoryMB = pick('SANDBOX_MEMORY_MB', env.SANDBOX_MEMORY_MB, DEFAULT_MEMORY_MB, maxMemoryMB, 'SANDBOX_MAX_MEMORY_MB', ' MB');
  const diskMB = pick('SANDBOX_DISK_MB', env.SANDBOX_DISK_MB, DEFAULT_DISK_MB, maxDiskMB, 'SANDBOX_MAX_DISK_MB', ' MB');
  const cpuCount = pick('SANDBOX_CPU_COUNT', env.SANDBOX_CPU_COUNT, 0, maxCpuCount, 'SANDBOX_MAX_CPU_COUNT', '');
  const maxProcesses = env.SANDBOX_MAX_PROCESSES ?? DEFAULT_MAX_PROCESSES;
  return { limits: { memoryMB, diskMB, cpuCount, maxProcesses, maxMemoryMB, maxDiskMB, maxCpuCount }, issues };
}

/**
 * Parses and resolves the limits from an environment (for processes that do not parse it with
 * limitsEnvShape themselves). Throws an Error naming every bad variable.
 */
export function loadLimits(env: NodeJS.ProcessEnv = process.env, machine?: Machine): SandboxLimits {
  const parsed = z.object(limitsEnvShape).safeParse(env);
  if (!parsed.success) throw new Error(parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; '));
  const { limits, issues } = resolveLimits(parsed.data, machine);
  if (issues.length) throw new Error(issues.map((i) => `${i.variable}: ${i.message}`).join('; '));
  return limits;
}

/** Fields a caller may set, with their maximum and unit. */
const CHECKED = [
  { field: 'memoryMB', max: (l: SandboxLimits) => l.maxMemoryMB, unit: ' MB', variable: 'SANDBOX_MAX_MEMORY_MB' },
  { field: 'diskMB', max: (l: SandboxLimits) => l.maxDiskMB, unit: ' MB', variable: 'SANDBOX_MAX_DISK_MB' },
  { field: 'cpuCount', max: (l: SandboxLimits) => l.maxCpuCount, unit: '', variable: 'SANDBOX_MAX_CPU_COUNT' },
] as const;

/**
 * Why `values` exceed the operator's maxima, as `<prefix><field>: … at most <max>` (one per field,
 * joined by '; '), or null when they do not. `prefix` names where the fields are (`body.`).
 */
export function overMaximum(limits: SandboxLimits, values: LimitOverrides, prefix = ''): string | null {
  const out: string[] = [];
  for (const c of CHECKED) {
    const v = values[c.field];
    const max = c.max(limits);
    if (v !== undefined && v !== null && v > max) out.push(`${prefix}${c.field}: ${v} is above the maximum of ${max}${c.unit} (${c.variable})`);
  }
  return out.length ? out.join('; ') : null;
}

/** A sandbox's effective limits: the caller's values, else the defaults. */
export function effectiveResources(limits: SandboxLimits, values: LimitOverrides = {}): SandboxResources {
  return {
    memoryMB: values.memoryMB ?? limits.memoryMB,
    diskMB: values.diskMB ?? limits.diskMB,
    cpuCount: values.cpuCount ?? limits.cpuCount,
    maxProcesses: values.maxProcesses ?? limits.maxProcesses,
  };
}
