/**
 * Snapshot steps that install packages over the sandbox's egress: an npm package and a pip package
 * from a package server the test runs on a test host (a network namespace of its own at an address
 * of 198.18.0.0/15). The server is a static file server: npm's registry is a JSON document per
 * package plus tarballs, pip's "simple" index a page of links per package. Nothing leaves the machine.
 */
import { execFileSync, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { api, T, unique } from '../../helpers/env';
import { TestHost } from '../../helpers/test-host';

jest.setTimeout(240_000);

const MARK = randomBytes(6).toString('hex');
const NPM_NAME = 'sap-probe-npm';
const PIP_NAME = 'sap-probe-pip';
const PIP_MODULE = 'sap_probe_pip';

let host: TestHost;
let server: ChildProcess;
let root: string;
const sandboxes: string[] = [];
const snapshots: string[] = [];

/** Writes a registry for one npm package and a simple index for one wheel into `dir`. */
function writePackages(dir: string, base: string): void {
  // npm: /<name> is the packument, /<name>/-/<name>-1.0.0.tgz the tarball (package/ inside).
  const src = fs.mkdtempSync(path.join(os.tmpdir(), 'sap-npm-src-'));
  fs.mkdirSync(path.join(src, 'package'));
  fs.writeFileSync(path.join(src, 'package', 'package.json'), JSON.stringify({ name: NPM_NAME, version: '1.0.0', main: 'index.js' }));
  fs.writeFileSync(path.join(src, 'package', 'index.js'), `module.exports = { mark: ${JSON.stringify(`npm-${MARK}`)} };\n`);
  fs.mkdirSync(path.join(dir, NPM_NAME, '-'), { recursive: true });
  const tgz = path.join(dir, NPM_NAME, '-', `${NPM_NAME}-1.0.0.tgz`);
  execFileSync('tar', ['czf', tgz, '-C', src, 'package']);
  fs.rmSync(src, { recursive: true, force: true });
  const bytes = fs.readFileSync(tgz);
  const packument = {
    name: NPM_NAME,
    'dist-tags': { latest: '1.0.0' },
    versions: {
      '1.0.0': {
        name: NPM_NAME,
        version: '1.0.0',
        main: 'index.js',
        dist: {
          tarball: `${base}/${NPM_NAME}/-/${NPM_NAME}-1.0.0.tgz`,
          shasum: createHash('sha1').update(bytes).digest('hex'),
          integrity: `sha512-${createHash('sha512').update(bytes).digest('base64')}`,
        },
      },
    },
  };
  // A file and a directory cannot share the name: the packument is /<name>/index.html, which the
  // static server answers for /<name>/ (npm asks for /<name>, and follows the server's redirect).
  fs.writeFileSync(path.join(dir, NPM_NAME, 'index.html'), JSON.stringify(packument));

  // pip: a wheel written by hand (a zip: the module, METADATA, WHEEL, RECORD), and /simple/<name>/.
  const wheel = `${PIP_MODULE}-1.0.0-py3-none-any.whl`;
  const info = `${PIP_MODULE}-1.0.0.dist-info`;
  const script = `
import sys, zipfile
files = {
  "${PIP_MODULE}/__init__.py": "MARK = 'pip-${MARK}'\\n",
  "${info}/METADATA": "Metadata-Version: 2.1\\nName: ${PIP_NAME}\\nVersion: 1.0.0\\n",
  "${info}/WHEEL": "Wheel-Version: 1.0\\nGenerator: sap-test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
}
record = "".join(f"{name},,\\n" for name in files) + "${info}/RECORD,,\\n"
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for name, text in files.items():
        z.writestr(name, text)
    z.writestr("${info}/RECORD", record)
`;
  fs.mkdirSync(path.join(dir, 'simple', PIP_NAME), { recursive: true });
  execFileSync('python3', ['-c', script, path.join(dir, 'simple', PIP_NAME, wheel)]);
  fs.writeFileSync(path.join(dir, 'simple', PIP_NAME, 'index.html'), `<!DOCTYPE html><html><body><a href="${wheel}">${wheel}</a></body></html>\n`);
}

/** Builds a snapshot, following its progress as server-sent events; answers the final result (or the build's error). */
async function build(body: { name: string; image: unknown }): Promise<{ status: string; error: string | null; id: string; log: string }> {
  snapshots.push(body.name);
  const res = await fetch(`${T.api()}/api/snapshots`, {
    method: 'POST',
    headers: { 'x-api-key': T.key(), 'content-type': 'application/json', accept: 'text/event-stream' },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  const events = text
    .split('\n\n')
    .filter((p) => p.includes('data: '))
    .map((p) => ({ event: /^event: (.*)$/m.exec(p)?.[1] ?? '', data: JSON.parse(/^data: (.*)$/m.exec(p)![1]!) }));
  const log = events
    .filter((e) => e.event === 'build_log')
    .map((e) => String(e.data.message))
    .join('\n');
  const failed = events.find((e) => e.event === 'error');
  if (failed) return { status: 'failed', error: String(failed.data.error), id: body.name, log };
  const result = events.find((e) => e.event === 'result');
  if (!result) throw new Error(`no result event: ${res.status} ${text.slice(0, 2000)}`);
  return { ...result.data, log };
}

async function run(sb: string, cmd: string, args: string[]): Promise<{ exitCode: number; stdout: string; stderr: string }> {
  const r = await api('POST', `/api/sandboxes/${sb}/exec/run`, { body: { cmd, args, timeout: 60 } });
  if (r.status !== 200) throw new Error(`exec: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
}

beforeAll(async () => {
  host = new TestHost('198.18');
  root = fs.mkdtempSync(path.join(os.tmpdir(), 'sap-pkg-server-'));
  const base = `http://${host.addr}:${host.port}`;
  writePackages(root, base);
  server = await host.serveDirectory(root);
});

afterAll(async () => {
  await Promise.all(sandboxes.map((id) => api('DELETE', `/api/sandboxes/${id}`).catch(() => undefined)));
  await Promise.all(snapshots.map((id) => api('DELETE', `/api/snapshots/${id}`).catch(() => undefined)));
  server?.kill('SIGKILL');
  host?.remove();
  if (root) fs.rmSync(root, { recursive: true, force: true });
});

describe('snapshot steps over the egress', () => {
  it('installs an npm package and a pip package from a package server on a test host; sandboxes from the snapshot have them', async () => {
    const base = `http://${host.addr}:${host.port}`;
    const snap = await build({
      name: unique('pkgs'),
      image: {
        steps: [
          { type: 'env', args: { vars: { PIP_INDEX_URL: `${base}/simple/`, PIP_TRUSTED_HOST: host.addr } } },
          { type: 'pip_install', args: { packages: [PIP_NAME] } },
          { type: 'workdir', args: { path: '/workspace/app' } },
          { type: 'run', args: { commands: [`npm install --no-audit --no-fund --registry ${base}/ ${NPM_NAME}`] } },
        ],
      },
    });
    if (snap.status !== 'ready') throw new Error(`snapshot ${snap.status}: ${snap.error}\n${snap.log}`);

    const r = await api('POST', '/api/sandboxes', { body: { snapshot: snap.id } });
    expect(r.status).toBe(201);
    sandboxes.push(r.body.sandboxID as string);
    const sb = r.body.sandboxID as string;
    const py = await run(sb, 'python3', ['-c', `import ${PIP_MODULE}; print(${PIP_MODULE}.MARK)`]);
    expect([py.exitCode, py.stdout.trim()]).toEqual([0, `pip-${MARK}`]);
    const js = await run(sb, 'node', ['-e', `console.log(require(${JSON.stringify(`/workspace/app/node_modules/${NPM_NAME}`)}).mark)`]);
    expect([js.exitCode, js.stdout.trim()]).toEqual([0, `npm-${MARK}`]);
  });

  it("a pip_install of a package the index does not have fails the build with pip's message", async () => {
    const base = `http://${host.addr}:${host.port}`;
    const snap = await build({
      name: unique('pkgs-missing'),
      image: {
        steps: [
          { type: 'env', args: { vars: { PIP_INDEX_URL: `${base}/simple/`, PIP_TRUSTED_HOST: host.addr } } },
          { type: 'pip_install', args: { packages: ['sap-no-such-package'] } },
        ],
      },
    });
    expect(snap.status).toBe('failed');
    expect(snap.error).toMatch(/step 2 \(pip_install\) failed/);
    expect(`${snap.error}\n${snap.log}`).toMatch(/sap-no-such-package/);
  });
});
