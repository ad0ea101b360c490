#!/usr/bin/env node
import fs from 'node:fs';
import { Command, Option } from 'commander';
import { SapApiError, SapClient } from '../client';
import { batchRun } from './batch-run';

/**
 * `sap`: the platform's command line. Key and URL come from --key/--url or SAP_API_KEY/SAP_API_URL.
 * An error answer prints its error body on stderr and exits 1.
 */
const program = new Command();
program
  .name('sap')
  .description('Sandbox Agent Platform command line')
  .addOption(new Option('--url <url>', 'API base URL').env('SAP_API_URL').default('http://127.0.0.1:8080'))
  .addOption(new Option('--key <key>', 'API key').env('SAP_API_KEY'))
  .showHelpAfterError();

function client(): SapClient {
  const o = program.opts<{ url: string; key?: string }>();
  if (!o.key) throw new UsageError('no API key: pass --key or set SAP_API_KEY');
  return new SapClient({ url: o.url, apiKey: o.key });
}

class UsageError extends Error {}

const print = (v: unknown): void => {
  process.stdout.write(`${JSON.stringify(v, null, 2)}\n`);
};
const parseJson = (what: string) => (text: string) => {
  try {
    return JSON.parse(text) as Record<string, unknown>;
  } catch {
    throw new UsageError(`${what}: not JSON`);
  }
};
const positiveInt = (what: string) => (text: string) => {
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1) throw new UsageError(`${what}: must be a positive integer`);
  return n;
};

const agents = program.command('agents').description('register and list agents');
agents
  .command('create')
  .description('register an agent from a JSON file (the POST /v1/agents body)')
  .requiredOption('-f, --file <file>', 'agent definition (JSON)')
  .action(async (o: { file: string }) => print(await client().agents.create(parseJson(o.file)(fs.readFileSync(o.file, 'utf8')) as never)));
agents
  .command('list')
  .description('list agents')
  .option('--limit <n>', 'page size', positiveInt('--limit'))
  .action(async (o: { limit?: number }) => {
    const c = client();
    let cursor: string | undefined;
    const all = [];
    do {
      const page = await c.agents.list({ limit: o.limit ?? 200, cursor });
      all.push(...page.items);
      cursor = page.next_cursor ?? undefined;
    } while (cursor && !o.limit);
    print(all);
  });

const sessions = program.command('sessions').description('run sessions');
sessions
  .command('run <agent>')
  .description('start a session, wait for it to end, print its result')
  .option('--input <json>', 'input object', parseJson('--input'), {})
  .option('--metadata <json>', 'metadata object', parseJson('--metadata'), {})
  .action(async (agent: string, o: { input: Record<string, unknown>; metadata: Record<string, unknown> }) => {
    const { session, result } = await client().sessions.run(agent, { input: o.input, metadata: o.metadata });
    print({ session_id: session.id, ...result });
    if (result.status !== 'completed') process.exitCode = 1;
  });

sessions
  .command('logs <agent> <id>')
  .description("print a session's stdout and stderr in the order written (kept after it ends)")
  .addOption(new Option('--stream <stream>', 'only one stream').choices(['stdout', 'stderr', 'all']).default('all'))
  .action(async (agent: string, id: string, o: { stream: 'stdout' | 'stderr' | 'all' }) => {
    process.stdout.write(await client().sessions.logs(agent, id, { stream: o.stream }));
  });
sessions
  .command('list <agent>')
  .description("list an agent's sessions, newest first (one JSON object per line)")
  .addOption(new Option('--status <status>', 'only sessions in this status').choices(['creating', 'running', 'completed', 'failed']))
  .option('--limit <n>', 'at most this many (default: all)', positiveInt('--limit'))
  .action(async (agent: string, o: { status?: string; limit?: number }) => {
    const c = client();
    let cursor: string | undefined;
    let n = 0;
    do {
      const page = await c.sessions.list(agent, { status: o.status, limit: Math.min(200, o.limit ?? 200), cursor });
      for (const s of page.items) {
        if (o.limit !== undefined && n >= o.limit) break;
        n++;
        process.stdout.write(`${JSON.stringify({ id: s.id, status: s.status, created_at: s.created_at, outcome: s.outcome })}\n`);
      }
      cursor = page.next_cursor ?? undefined;
    } while (cursor && (o.limit === undefined || n < o.limit));
  });

const conv = program.command('conversations').description('durable multi-turn agent conversations (docs/api/conversations.md)');
conv
  .command('start <agent>')
  .description('start a conversation (optionally with a first message); prints it')
  .option('--input <text>', 'the first message')
  .option('--runner <json>', 'runner argv as a JSON array (default: the Claude Agent SDK runner)', (t) => parseJson('--runner')(t) as unknown as string[])
  .option('--limits <json>', 'limits {tokens, turnSeconds, turns}', parseJson('--limits'))
  .action(async (agent: string, o: { input?: string; runner?: string[]; limits?: Record<string, unknown> }) =>
    print(
      await client().conversations.create(agent, {
        ...(o.input ? { input: o.input } : {}),
        ...(o.runner ? { runner: o.runner } : {}),
        ...(o.limits ? { limits: o.limits } : {}),
      }),
    ),
  );
conv
  .command('say <id> <text>')
  .description('send a message (the next turn); prints its turn number')
  .option('--idempotency-key <key>', 'makes a repeat answer the first')
  .action(async (id: string, text: string, o: { idempotencyKey?: string }) =>
    print(await client().conversations.send(id, text, { idempotencyKey: o.idempotencyKey })),
  );
conv
  .command('events <id>')
  .description('print events after a sequence number, one JSON object per line; --follow keeps following')
  .option('--after <seq>', 'after this sequence number (default 0: from the start)', (t) => Number(t))
  .addOption(new Option('--level <level>', 'user, progress or internal').choices(['user', 'progress', 'internal']).default('progress'))
  .option('--follow', 'keep following until interrupted (or, with --turn, until that turn ends)')
  .option('--turn <n>', 'with --follow: stop once this turn ends', positiveInt('--turn'))
  .action(async (id: string, o: { after?: number; level: 'user' | 'progress' | 'internal'; follow?: boolean; turn?: number }) => {
    const c = client();
    if (!o.follow) {
      for (const e of (await c.conversations.events(id, { after: o.after, level: o.level, limit: 500 })).events) process.stdout.write(`${JSON.stringify(e)}\n`);
      return;
    }
    const ac = new AbortController();
    process.once('SIGINT', () => ac.abort());
    for await (const e of c.followConversation(id, {
      after: o.after,
      level: o.level,
      signal: ac.signal,
      until: (e) => o.turn !== undefined && e.type === 'turn_complete' && e.turn === o.turn,
    }))
      process.stdout.write(`${JSON.stringify(e)}\n`);
  });
conv
  .command('turns <id>')
  .description("print a conversation's turns")
  .action(async (id: string) => print(await client().conversations.turns(id)));
conv
  .command('fork <id>')
  .description('fork at the end of a turn (--count and --evaluate: best-of-N)')
  .requiredOption('--turn <n>', 'the turn', (t) => Number(t))
  .option('--input <text>', 'the first message of each fork')
  .option('--count <n>', 'forks (default 1)', positiveInt('--count'))
  .option('--evaluate <command>', 'bash command run in each fork after its first turn; ranks them by exit code')
  .action(async (id: string, o: { turn: number; input?: string; count?: number; evaluate?: string }) =>
    print(
      await client().conversations.fork(id, {
        turn: o.turn,
        ...(o.input ? { input: o.input } : {}),
        ...(o.count ? { count: o.count } : {}),
        ...(o.evaluate ? { evaluate: o.evaluate } : {}),
      }),
    ),
  );
conv
  .command('rewind <id>')
  .description('rewind to the end of a turn (later turns are kept, marked left)')
  .requiredOption('--turn <n>', 'the turn', (t) => Number(t))
  .action(async (id: string, o: { turn: number }) => print(await client().conversations.rewind(id, o.turn)));
conv
  .command('archive <id>')
  .description('archive: destroy its sandbox (it can still be forked)')
  .action(async (id: string) => print(await client().conversations.archive(id)));

const batch = program.command('batch').description('run batches of sessions');
batch
  .command('run <agent> <items>')
  .description('run one session per line of an NDJSON items file; write results to --out as they finish; rerun to resume')
  .requiredOption('--out <file>', 'results file (NDJSON); <file>.batch remembers the batch')
  .option('--concurrency <n>', 'sessions at once (default 10)', positiveInt('--concurrency'))
  .option('--max-attempts <n>', 'attempts per item (default 1)', positiveInt('--max-attempts'))
  .action(async (agent: string, items: string, o: { out: string; concurrency?: number; maxAttempts?: number }) => {
    const ac = new AbortController();
    const onSignal = () => ac.abort();
    process.once('SIGINT', onSignal);
    process.once('SIGTERM', onSignal);
    process.exitCode = await batchRun(client(), { agent, itemsFile: items, out: o.out, concurrency: o.concurrency, maxAttempts: o.maxAttempts }, ac.signal);
  });
batch
  .command('status <id>')
  .description('print a batch and its counts')
  .action(async (id: string) => print(await client().batches.getById(id)));
batch
  .command('cancel <id>')
  .description('cancel a batch: nothing new starts, running sessions end')
  .action(async (id: string) => print(await client().batches.cancelById(id)));

program.parseAsync(process.argv).catch((err: unknown) => {
  if (err instanceof SapApiError) process.stderr.write(`error: ${JSON.stringify(err.body)}\n`);
  else if (err instanceof UsageError) process.stderr.write(`error: ${err.message}\n`);
  else process.stderr.write(`error: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(process.exitCode && process.exitCode !== 0 ? process.exitCode : 1);
});
