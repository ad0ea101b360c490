/**
 * A reporter that makes sure Jest exits. Once the run is complete (global teardown follows and stops
 * the stack: allow it SAP_TEST_EXIT_GRACE_MS, default 120 s), a process still alive is held by
 * something a test left open: the watchdog prints what (servers, sockets, child processes, timers)
 * and exits with status 1, so a hung run fails fast and names its cause instead of running into the
 * CI time limit. The timer is unref'd: it never keeps a finished process alive by itself.
 */
function describeHandle(h) {
  const kind = h?.constructor?.name ?? typeof h;
  try {
    if (kind === 'ChildProcess') return `child process pid ${h.pid}: ${(h.spawnargs ?? []).join(' ').slice(0, 200)}`;
    if (kind === 'Server' && typeof h.address === 'function') return `server listening on ${JSON.stringify(h.address())}`;
    if (kind === 'Socket' || kind === 'TLSSocket') {
      if (h.remotePort) return `socket ${h.localAddress}:${h.localPort} -> ${h.remoteAddress}:${h.remotePort}`;
      if (h._handle?.fd !== undefined && h._handle.fd <= 2) return null; // the process's own stdio
      return `socket (${h._pendingData ? 'pending' : 'idle'}) fd ${h._handle?.fd ?? '?'}`;
    }
    if (kind === 'Timeout') return `timer of ${h._idleTimeout} ms: ${String(h._onTimeout).slice(0, 160).replace(/\s+/g, ' ')}`;
    return kind;
  } catch {
    return kind;
  }
}

class ExitWatchdog {
  onRunComplete() {
    const grace = Number(process.env.SAP_TEST_EXIT_GRACE_MS ?? 120_000);
    const timer = setTimeout(() => {
      const handles = process._getActiveHandles().map(describeHandle).filter(Boolean);
      const requests = process._getActiveRequests().map((r) => r?.constructor?.name ?? typeof r);
      process.stderr.write(
        `\nexit watchdog: Jest did not exit ${grace / 1000} s after the run completed; still open:\n` +
          [...handles, ...requests.map((r) => `request ${r}`)].map((d) => `  - ${d}`).join('\n') +
          '\nFailing the run. Close these in the test (afterAll / finally) that opened them.\n',
      );
      process.exit(1);
    }, grace);
    timer.unref();
  }
}
module.exports = ExitWatchdog;
