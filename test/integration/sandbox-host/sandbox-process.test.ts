/** The unisolated `process` provider: same contract, paths mapped under the sandbox's root directory. */
import { promises as fsp, existsSync } from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { HostClient } from '../../../sandbox/host-contract/client';
import { startHost, type RunningHost } from '../../../sandbox/host/server';

describe('sandbox host (process provider)', () => {
  let dataDir: string;
  let host: RunningHost;
  let client: HostClient;

  beforeAll(async () => {
    dataDir = await fsp.mkdtemp(path.join(os.tmpdir(), 'sap-proc-'));
    host = await startHost({ dataDir, token: 't', provider: 'process', listen: '127.0.0.1:0' });
    client = new HostClient({ url: host.url, token: 't' });
  });

  afterAll(async () => {
    await host.close();
    await fsp.rm(dataDir, { recursive: true, force: true });
  });

  it('maps files and cwd under the sandbox root and runs the entrypoint', async () => {
    const id = `sb-proc${process.pid}`;
    const info = await client.createSandbox({
      id,
      orgId: 'o',
      files: { '/tmp/agent_input.json': '{"q":1}' },
      patches: [{ id: 'pa-1', script: 'echo patched > patch.txt' }],
      entrypoint: { argv: ['bash', '-c', 'cat "$SANDBOX_ROOT/tmp/agent_input.json" > "$SANDBOX_ROOT/tmp/agent_result.json"; pwd; exit 2'] },
    });
    expect(info).toMatchObject({ provider: 'process', status: 'running' });
    const root = path.join(dataDir, 'sandboxes', id, 'root');
    expect(await client.entrypointStatus(id, { waitMs: 5000 })).toMatchObject({ state: 'exited', exitCode: 2 });
    expect((await client.readFile(id, '/tmp/agent_result.json'))?.toString()).toBe('{"q":1}');
    expect((await client.readFile(id, '/workspace/patch.txt'))?.toString()).toBe('patched\n');
    expect((await client.entrypointOutput(id)).toString()).toBe(path.join(root, 'workspace') + '\n');
    const r = await client.execRun(id, { cmd: 'sh', args: ['-c', 'echo $HOME'] });
    expect(r.stdout).toBe(path.join(root, 'root') + '\n');
    expect(await client.destroySandbox(id)).toBe(true);
    expect(existsSync(path.join(dataDir, 'sandboxes', id))).toBe(false);
  });
});
