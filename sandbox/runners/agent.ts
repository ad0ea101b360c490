/**
 * The agent runner that runs inside a sandbox (copied there by the API as /opt/sap/agent.cjs; it
 * must import nothing but Node's own modules). It speaks JSON lines:
 *
 *   stdin   {"type":"prompt","text":…}   run a turn (queued while one runs)
 *           {"type":"interrupt"}         abort the running turn → {"type":"interrupted"}
 *           {"type":"configure",…}       change options for the next turns → {"type":"configured"}
 *   stdout  {"type":"ready"} first, then one event per line: the agent SDK's messages as it yields
 *           them (`system`, `assistant`, `user`, `result`, …), `turn_complete` after each turn,
 *           `error` on failure.
 *
 * Two modes:
 *   node agent.cjs --config <file> --state <file>
 *       the built-in runner on the Claude Agent SDK (`@anthropic-ai/claude-agent-sdk`: the platform
 *       provides it read-only at /opt/sap/node_modules; one in the working directory's node_modules
 *       or a global one comes first).
 *   node agent.cjs --config <file> --state <file> -- <runner argv…>
 *       runs another runner speaking the same protocol (its stdin/stdout passed through unchanged;
 *       SAP_AGENT_CONFIG names the config file for it).
 * In both, the first `session_id` (or `sessionId`) seen on an event is written to the state file as
 * `{"agentSessionID": …}`, where the API reads it.
 */
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { pathToFileURL } from 'node:url';

/** One MCP tool server as the API accepts it. */
export interface McpServer {
  command?: string;
  args?: string[];
  env?: Record<string, string>;
  type?: string;
  url?: string;
  headers?: Record<string, string>;
}

/** Options of an agent session, as the API received them (and as `configure` changes them). */
export interface AgentConfig {
  prompt?: string;
  model?: string;
  systemPrompt?: string;
  allowedTools?: string[];
  permissionMode?: string;
  maxTurns?: number;
  cwd?: string;
  /** Tool servers: a command (stdio) or a URL (`type` http or sse, optional headers). */
  mcpServers?: Record<string, McpServer>;
  resume?: string;
}

/**
 * The options given to the Claude Agent SDK's `query()` for one turn: the session's options, the
 * sandbox's environment (ANTHROPIC_API_KEY and the rest), and `resume` so that later turns continue
 * the conversation. Pure: no I/O.
 */
export function sdkOptions(config: AgentConfig, env: Record<string, string | undefined>, resume?: string): Record<string, unknown> {
  const o: Record<string, unknown> = { env: { ...env } };
  if (config.model) o.model = config.model;
  if (config.systemPrompt) o.systemPrompt = config.systemPrompt;
  if (config.allowedTools) {
    // The spec's allowedTools restricts the tools available. The SDK's option of that name only
    // approves them without asking; its `tools` sets which built-in tools exist at all. So both:
    // the built-in names (a rule such as `Bash(git:*)` names Bash; MCP tools are not built in)
    // become `tools`, and the list as given is approved.
    o.allowedTools = [...config.allowedTools];
    o.tools = [...new Set(config.allowedTools.map((t) => t.replace(/\(.*$/, '').trim()).filter((t) => t && !t.startsWith('mcp__')))];
  }
  if (config.permissionMode) {
    o.permissionMode = config.permissionMode;
    if (config.permissionMode === 'bypassPermissions') o.allowDangerouslySkipPermissions = true;
  }
  if (config.maxTurns !== undefined) o.maxTurns = config.maxTurns;
  o.cwd = config.cwd ?? env.PWD ?? '/workspace';
  if (config.mcpServers) {
    o.mcpServers = Object.fromEntries(
      Object.entries(config.mcpServers).map(([name, s]) => [
        name,
        s.url ? { type: s.type ?? 'http', url: s.url, headers: s.headers ?? {} } : { type: 'stdio', command: s.command, args: s.args ?? [], env: s.env ?? {} },
      ]),
    );
  }
  const r = resume ?? config.resume;
  if (r) o.resume = r;
  return o;
}

/** The session id an event carries, if any. */
export function sessionIdOf(event: unknown): string | undefined {
  if (!event || typeof event !== 'object') return undefined;
  const e = event as { session_id?: unknown; sessionId?: unknown };
  const id = e.session_id ?? e.sessionId;
  return typeof id === 'string' && id.length > 0 && id.length <= 200 ? id : undefined;
}

function parseArgs(argv: string[]): { config?: string; state?: string; runner: string[] } {
  const out: { config?: string; state?: string; runner: string[] } = { runner: [] };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--') {
      out.runner = argv.slice(i + 1);
      break;
    }
    if (argv[i] === '--config') out.config = argv[++i];
    else if (argv[i] === '--state') out.state = argv[++i];
  }
  return out;
}

/** Writes the agent SDK's session id to the state file, once per distinct id. */
function stateWriter(file: string | undefined): (event: unknown) => void {
  let last = '';
  return (event) => {
    const id = sessionIdOf(event);
    if (!id || id === last || !file) return;
    last = id;
    try {
      writeFileSync(`${file}.tmp`, JSON.stringify({ agentSessionID: id }));
      renameSync(`${file}.tmp`, file);
    } catch (err) {
      process.stderr.write(`agent runner: cannot write ${file}: ${(err as Error).message}\n`);
    }
  };
}

/** Runs another runner, passing its stdio through and watching its stdout for the session id. */
function wrap(runner: string[], configFile: string | undefined, record: (e: unknown) => void): void {
  const child = spawn(runner[0]!, runner.slice(1), {
    stdio: ['pipe', 'pipe', 'inherit'],
    env: { ...process.env, ...(configFile ? { SAP_AGENT_CONFIG: configFile } : {}) },
  });
  process.stdin.pipe(child.stdin);
  child.stdin.on('error', () => undefined);
  child.stdout.pipe(process.stdout);
  let partial = '';
  child.stdout.on('data', (chunk: Buffer) => {
    partial += chunk.toString('utf8');
    let nl: number;
    while ((nl = partial.indexOf('\n')) >= 0) {
      const line = partial.slice(0, nl).trim();
      partial = partial.slice(nl + 1);
      if (!line.includes('ession')) continue;
      try {
        record(JSON.parse(line));
      } catch {
        /* not JSON: passed through anyway */
      }
    }
    if (partial.length > 1024 * 1024) partial = '';
  });
  for (const sig of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) process.on(sig, () => child.kill(sig));
  child.on('error', (err) => {
    process.stdout.write(`${JSON.stringify({ type: 'error', message: `cannot start runner ${runner[0]}: ${err.message}` })}\n`);
    process.exitCode = 127;
  });
  child.on('close', (code, signal) => {
    process.exitCode = code ?? (signal ? 128 + 15 : 1);
    process.stdin.unpipe(child.stdin);
    process.stdin.destroy();
  });
}

type QueryFn = (args: { prompt: string; options: Record<string, unknown> }) => AsyncIterable<unknown>;

/** Loads the Claude Agent SDK from the working directory's node_modules or a global one. */
async function loadSdk(cwd: string): Promise<QueryFn> {
  const name = '@anthropic-ai/claude-agent-sdk';
  const req = createRequire(path.join(cwd, 'noop.js'));
  let resolved: string | undefined;
  for (const base of [cwd, '/workspace', '/usr/local/lib/node_modules', '/usr/lib/node_modules', '/opt/sap']) {
    try {
      resolved = req.resolve(name, { paths: [base] });
      break;
    } catch {
      /* next */
    }
  }
  // A real dynamic import (the SDK is an ES module); `import()` would be compiled to require().
  const importEsm = new Function('u', 'return import(u)') as (u: string) => Promise<{ query?: QueryFn }>;
  const mod = await importEsm(resolved ? pathToFileURL(resolved).href : name);
  if (typeof mod.query !== 'function') throw new Error(`${name} has no query()`);
  return mod.query;
}

/** The built-in runner: each prompt is one `query()` turn; later turns resume the conversation. */
async function runClaude(config: AgentConfig, record: (e: unknown) => void): Promise<void> {
  const emit = (e: unknown) => {
    record(e);
    process.stdout.write(`${JSON.stringify(e)}\n`);
  };
  let query: QueryFn;
  try {
    query = await loadSdk(config.cwd ?? process.cwd());
  } catch (err) {
    emit({ type: 'error', message: `the Claude Agent SDK (@anthropic-ai/claude-agent-sdk) is not available in the sandbox: ${(err as Error).message}` });
    process.exitCode = 1;
    return;
  }
  let sessionId: string | undefined = config.resume;
  const queue: string[] = [];
  let current: AbortController | undefined;
  let closed = false;
  let wake: (() => void) | undefined;

  const rl = createInterface({ input: process.stdin });
  rl.on('line', (line) => {
    let msg: { type?: string; text?: unknown } & Record<string, unknown>;
    try {
      msg = JSON.parse(line) as typeof msg;
    } catch {
      if (line.trim()) emit({ type: 'error', message: 'stdin lines must be JSON' });
      return;
    }
    if (msg.type === 'prompt' && typeof msg.text === 'string') {
      queue.push(msg.text);
      wake?.();
    } else if (msg.type === 'interrupt') {
      if (current) {
        current.abort();
        emit({ type: 'interrupted' });
      }
    } else if (msg.type === 'configure') {
      const { type: _t, prompt: _p, ...rest } = msg;
      Object.assign(config, rest);
      if (typeof rest.resume === 'string') sessionId = rest.resume;
      emit({ type: 'configured' });
    } else {
      emit({ type: 'error', message: `unknown message type ${String(msg.type)}` });
    }
  });
  rl.on('close', () => {
    closed = true;
    wake?.();
  });

  emit({ type: 'ready' });
  if (config.prompt) queue.push(config.prompt);
  for (;;) {
    if (queue.length === 0) {
      if (closed) return;
      await new Promise<void>((r) => (wake = r));
      wake = undefined;
      continue;
    }
    const text = queue.shift()!;
    current = new AbortController();
    try {
      const options = { ...sdkOptions(config, process.env, sessionId), abortController: current };
      for await (const m of query({ prompt: text, options })) {
        sessionId = sessionIdOf(m) ?? sessionId;
        emit(m);
      }
    } catch (err) {
      if (!current.signal.aborted) emit({ type: 'error', message: (err as Error).message });
    }
    current = undefined;
    emit({ type: 'turn_complete', session_id: sessionId });
  }
}

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  const record = stateWriter(args.state);
  if (args.runner.length > 0) {
    wrap(args.runner, args.config, record);
    return;
  }
  const config = (args.config && existsSync(args.config) ? JSON.parse(readFileSync(args.config, 'utf8')) : {}) as AgentConfig;
  await runClaude(config, record);
}

if (require.main === module) {
  main().catch((err) => {
    process.stdout.write(`${JSON.stringify({ type: 'error', message: (err as Error).message })}\n`);
    process.exit(1);
  });
}
