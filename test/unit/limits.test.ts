/**
 * The sandbox limits' defaults and maxima (config/limits.ts), as the API's configuration, the host
 * and the worker read them; and how an OOM-killed entrypoint ends a session (decideEnd).
 */
import { ConfigError, loadConfig } from '../../config';
import { effectiveResources, loadLimits, overMaximum, resolveLimits } from '../../config/limits';
import { decideEnd } from '../../services/sessions/session-runs';

const machine = { totalMemoryMB: 8000, cores: 4 };

describe('sandbox limits', () => {
  it('has documented defaults, the maxima from the machine', () => {
    expect(loadLimits({}, machine)).toEqual({
      memoryMB: 2048,
      diskMB: 20480,
      cpuCount: 0,
      maxProcesses: 512,
      maxMemoryMB: 8000,
      maxDiskMB: 20480,
      maxCpuCount: 4,
    });
  });

  it('reads every variable', () => {
    const env = {
      SANDBOX_MEMORY_MB: '1024',
      SANDBOX_DISK_MB: '4096',
      SANDBOX_CPU_COUNT: '1.5',
      SANDBOX_MAX_PROCESSES: '100',
      SANDBOX_MAX_MEMORY_MB: '6000',
      SANDBOX_MAX_DISK_MB: '10000',
      SANDBOX_MAX_CPU_COUNT: '2',
    };
    expect(loadLimits(env, machine)).toEqual({
      memoryMB: 1024,
      diskMB: 4096,
      cpuCount: 1.5,
      maxProcesses: 100,
      maxMemoryMB: 6000,
      maxDiskMB: 10000,
      maxCpuCount: 2,
    });
  });

  it('keeps the disk default (a sparse image, not memory) when only the memory is set', () => {
    expect(loadLimits({ SANDBOX_MEMORY_MB: '512' }, machine)).toMatchObject({ memoryMB: 512, diskMB: 20480 });
  });

  it('lowers an implicit default to a smaller maximum', () => {
    expect(loadLimits({}, { totalMemoryMB: 1500, cores: 1 })).toMatchObject({ memoryMB: 1500, diskMB: 20480, maxMemoryMB: 1500, maxCpuCount: 1 });
    expect(loadLimits({ SANDBOX_MAX_DISK_MB: '1000' }, machine)).toMatchObject({ memoryMB: 2048, diskMB: 1000 });
  });

  it('refuses an explicit default above its maximum, naming the variables', () => {
    expect(() => loadLimits({ SANDBOX_MEMORY_MB: '9000' }, machine)).toThrow(/SANDBOX_MEMORY_MB: 9000 is above SANDBOX_MAX_MEMORY_MB \(8000 MB\)/);
    expect(() => loadLimits({ SANDBOX_DISK_MB: '30000' }, machine)).toThrow(/SANDBOX_DISK_MB.*SANDBOX_MAX_DISK_MB/);
    expect(() => loadLimits({ SANDBOX_CPU_COUNT: '8' }, machine)).toThrow(/SANDBOX_CPU_COUNT.*SANDBOX_MAX_CPU_COUNT \(4\)/);
    expect(resolveLimits({ SANDBOX_MEMORY_MB: 100, SANDBOX_MAX_MEMORY_MB: 50 }, machine).issues).toEqual([
      { variable: 'SANDBOX_MEMORY_MB', message: '100 is above SANDBOX_MAX_MEMORY_MB (50 MB)' },
    ]);
  });

  it.each([
    ['SANDBOX_MEMORY_MB', 'lots'],
    ['SANDBOX_MEMORY_MB', '8'],
    ['SANDBOX_MEMORY_MB', '1.5'],
    ['SANDBOX_DISK_MB', '0'],
    ['SANDBOX_CPU_COUNT', '-1'],
    ['SANDBOX_MAX_PROCESSES', '0'],
    ['SANDBOX_MAX_MEMORY_MB', 'x'],
    ['SANDBOX_MAX_DISK_MB', '-5'],
    ['SANDBOX_MAX_CPU_COUNT', '0'],
  ])('names the variable when %s=%s is bad (API configuration and host alike)', (name, value) => {
    expect(() => loadConfig({ [name]: value })).toThrow(ConfigError);
    expect(() => loadConfig({ [name]: value })).toThrow(new RegExp(name));
    expect(() => loadLimits({ [name]: value })).toThrow(new RegExp(name));
  });

  it('is part of the API configuration', () => {
    const cfg = loadConfig({ SANDBOX_MEMORY_MB: '1024', SANDBOX_MAX_DISK_MB: '5000' });
    expect(cfg.limits).toMatchObject({ memoryMB: 1024, diskMB: 5000, cpuCount: 0, maxProcesses: 512, maxDiskMB: 5000 });
    expect(() => loadConfig({ SANDBOX_DISK_MB: '6000', SANDBOX_MAX_DISK_MB: '5000' })).toThrow(/SANDBOX_DISK_MB: 6000 is above SANDBOX_MAX_DISK_MB/);
  });

  it('names each field over its maximum, with the maximum', () => {
    const limits = loadLimits({}, machine);
    expect(overMaximum(limits, { memoryMB: 8000, diskMB: 20480, cpuCount: 4 })).toBeNull();
    expect(overMaximum(limits, {})).toBeNull();
    expect(overMaximum(limits, { memoryMB: 8001 }, 'body.')).toBe('body.memoryMB: 8001 is above the maximum of 8000 MB (SANDBOX_MAX_MEMORY_MB)');
    expect(overMaximum(limits, { diskMB: 20481, cpuCount: 5 }, 'body.')).toBe(
      'body.diskMB: 20481 is above the maximum of 20480 MB (SANDBOX_MAX_DISK_MB); body.cpuCount: 5 is above the maximum of 4 (SANDBOX_MAX_CPU_COUNT)',
    );
  });

  it('fills absent values with the defaults', () => {
    const limits = loadLimits({}, machine);
    expect(effectiveResources(limits)).toEqual({ memoryMB: 2048, diskMB: 20480, cpuCount: 0, maxProcesses: 512 });
    expect(effectiveResources(limits, { memoryMB: 64, cpuCount: 1 })).toEqual({ memoryMB: 64, diskMB: 20480, cpuCount: 1, maxProcesses: 512 });
  });
});

describe('a session OOM-killed', () => {
  const exit = { exitCode: 137, timedOut: false, signal: 'SIGKILL', oomKilled: true };

  it('ends failed with reason oom, naming the limit', () => {
    expect(decideEnd(exit, false, { data: null }, undefined, 2048)).toEqual({
      status: 'failed',
      result: null,
      outcome: { reason: 'oom', exit_code: 137, message: 'entrypoint was killed: the sandbox reached its memory limit (2048 MB)' },
    });
    // A killed child made the entrypoint fail; the memory limit is the reason, not the result file it could not write.
    expect(decideEnd({ exitCode: 1, timedOut: false, signal: null, oomKilled: true }, false, { data: null, error: 'not JSON' }, undefined, 64).outcome).toEqual(
      {
        reason: 'oom',
        exit_code: 1,
        message: 'entrypoint exited with code 1 after a process was killed: the sandbox reached its memory limit (64 MB)',
      },
    );
  });

  it('stays cancelled or timed out when it was', () => {
    expect(decideEnd(exit, true, { data: null }, undefined, 2048).outcome?.reason).toBe('cancelled');
    expect(decideEnd({ ...exit, timedOut: true }, false, { data: null }, undefined, 2048).outcome?.reason).toBe('timeout');
  });

  it('completes, with a note, when the entrypoint itself succeeded', () => {
    expect(decideEnd({ exitCode: 0, timedOut: false, signal: null, oomKilled: true }, false, { data: { ok: 1 } }, undefined, 512)).toEqual({
      status: 'completed',
      result: { ok: 1 },
      outcome: { reason: null, exit_code: 0, message: 'a process of the sandbox was killed: the sandbox reached its memory limit (512 MB)' },
    });
  });

  it('is unchanged without oomKilled', () => {
    expect(decideEnd({ exitCode: 137, timedOut: false, signal: 'SIGKILL' }, false, { data: null }).outcome).toEqual({
      reason: 'exit_code',
      exit_code: 137,
      message: 'entrypoint was killed by SIGKILL',
    });
    expect(decideEnd({ exitCode: 0, timedOut: false, signal: null, oomKilled: false }, false, { data: {} }).outcome).toEqual({
      reason: null,
      exit_code: 0,
      message: null,
    });
  });
});
