/**
 * The sealed-secrets proxy's certificate authority (docs/sealed-secrets.md): one per host, made at its
 * first start under DATA_DIR/seal (root only: the directory 0700, keys 0600) with the `openssl` CLI
 * (Node's crypto cannot issue certificates), valid 10 years. Leaf certificates, one per host name the
 * proxy terminates TLS for, are issued on demand (one `openssl x509` run, ~10 ms) for 30 days with one
 * leaf key, and kept in memory. Rotation: remove DATA_DIR/seal and restart the host (docs).
 */
import { execFile } from 'node:child_process';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import * as path from 'node:path';
import * as tls from 'node:tls';

/** Where every sandbox finds the CA (NODE_EXTRA_CA_CERTS) and the host's roots plus it (SSL_CERT_FILE, REQUESTS_CA_BUNDLE). */
export const SANDBOX_CA_PATH = '/etc/ssl/osb-sealed-ca.pem';
export const SANDBOX_BUNDLE_PATH = '/etc/ssl/osb-sealed-bundle.pem';
/** The variables a sandbox with sealed secrets gets, so that its clients trust the proxy's certificates. */
export const TRUST_ENV: Readonly<Record<string, string>> = {
  NODE_EXTRA_CA_CERTS: SANDBOX_CA_PATH,
  SSL_CERT_FILE: SANDBOX_BUNDLE_PATH,
  REQUESTS_CA_BUNDLE: SANDBOX_BUNDLE_PATH,
  CURL_CA_BUNDLE: SANDBOX_BUNDLE_PATH,
};
/** The host's own roots, copied into the sandboxes' bundle (Debian's path; absent: the CA alone). */
const HOST_BUNDLE = '/etc/ssl/certs/ca-certificates.crt';

const LEAF_DAYS = 30;
/** A leaf is made again when less than this is left of it. */
const LEAF_RENEW_MS = 5 * 86_400_000;
/** Leaf contexts kept (least recently made dropped first): a bound on memory per host. */
const MAX_LEAVES = 4096;

function openssl(args: string[], input?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = execFile('openssl', args, { maxBuffer: 1 << 20 }, (err, out, stderr) =>
      err ? reject(new Error(`openssl ${args[0]}: ${stderr.trim() || err.message}`)) : resolve(out),
    );
    child.stdin!.on('error', () => undefined); // openssl may exit without reading it
    child.stdin!.end(input ?? '');
  });
}

const exists = (p: string) =>
  fsp.stat(p).then(
    () => true,
    () => false,
  );

export class SealCa {
  private caPem = '';
  private leafKey = '';
  private readonly leaves = new Map<string, { ctx: tls.SecureContext; until: number }>();
  private readonly making = new Map<string, Promise<tls.SecureContext>>();

  constructor(private readonly dir: string) {}

  /** The CA's certificate (PEM). */
  get certificate(): string {
    return this.caPem;
  }

  /** Makes the CA and the leaf key unless they are there (several starts at once: the first rename wins). */
  async init(hostLabel: string): Promise<void> {
    await fsp.mkdir(this.dir, { recursive: true, mode: 0o700 });
    await fsp.chmod(this.dir, 0o700);
    const key = path.join(this.dir, 'ca.key');
    const cert = path.join(this.dir, 'ca.pem');
    if (!(await exists(cert)) || !(await exists(key))) {
      const tmp = path.join(this.dir, `tmp-${process.pid}-${randomBytes(4).toString('hex')}`);
      await fsp.mkdir(tmp, { mode: 0o700 });
      const subject = `/O=Sandbox Agent Platform/CN=sealed secrets proxy CA ${hostLabel.replace(/[^A-Za-z0-9 ._-]/g, '').slice(0, 40)}`;
      await openssl([
        'req',
        '-x509',
        '-newkey',
        'ec',
        '-pkeyopt',
        'ec_paramgen_curve:prime256v1',
        '-nodes',
        '-keyout',
        path.join(tmp, 'ca.key'),
        '-out',
        path.join(tmp, 'ca.pem'),
        '-days',
        '3650',
        '-subj',
        subject,
        '-addext',
        'basicConstraints=critical,CA:TRUE,pathlen:0',
        '-addext',
        'keyUsage=critical,keyCertSign,cRLSign',
      ]);
      await fsp.chmod(path.join(tmp, 'ca.key'), 0o600);
      await fsp.rename(path.join(tmp, 'ca.key'), key);
      await fsp.rename(path.join(tmp, 'ca.pem'), cert);
      await fsp.rm(tmp, { recursive: true, force: true });
      await fsp.rm(path.join(this.dir, 'leaf.key'), { force: true });
    }
    this.caPem = await fsp.readFile(cert, 'utf8');
    const leafKeyFile = path.join(this.dir, 'leaf.key');
    if (!(await exists(leafKeyFile))) {
      const { privateKey } = generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
      await fsp.writeFile(leafKeyFile, privateKey.export({ type: 'pkcs8', format: 'pem' }), { mode: 0o600 });
    }
    this.leafKey = await fsp.readFile(leafKeyFile, 'utf8');
    // One request for every leaf: the name goes into each certificate's subjectAltName.
    const csr = path.join(this.dir, 'leaf.csr');
    await openssl(['req', '-new', '-key', leafKeyFile, '-subj', '/O=Sandbox Agent Platform/CN=sealed secrets proxy', '-out', csr]);
  }

  /** The host's roots followed by the CA: what sandboxes use as their whole bundle. */
  async bundle(): Promise<string> {
    const roots = await fsp.readFile(HOST_BUNDLE, 'utf8').catch(() => '');
    return `${roots.trimEnd()}\n${this.caPem}`;
  }

  /** Writes the CA and the bundle into a sandbox root skeleton's /etc/ssl (only when they changed). */
  async install(root: string): Promise<void> {
    const dir = path.join(root, 'etc/ssl');
    await fsp.mkdir(dir, { recursive: true, mode: 0o755 });
    for (const [p, text] of [
      [SANDBOX_CA_PATH, this.caPem],
      [SANDBOX_BUNDLE_PATH, await this.bundle()],
    ] as const) {
      const file = path.join(root, p);
      if ((await fsp.readFile(file, 'utf8').catch(() => '')) === text) continue;
      await fsp.writeFile(`${file}.tmp`, text, { mode: 0o644 });
      await fsp.rename(`${file}.tmp`, file);
    }
  }

  /** The TLS context for `name` (a leaf made on first use, then cached; concurrent asks share one openssl run). */
  async contextFor(name: string): Promise<tls.SecureContext> {
    const cached = this.leaves.get(name);
    if (cached && cached.until - LEAF_RENEW_MS > Date.now()) return cached.ctx;
    let p = this.making.get(name);
    if (!p) {
      p = this.issue(name).finally(() => this.making.delete(name));
      this.making.set(name, p);
    }
    return p;
  }

  private async issue(name: string): Promise<tls.SecureContext> {
    if (!/^[a-z0-9.-]{1,253}$/.test(name)) throw new Error(`not a host name: ${name.slice(0, 80)}`);
    const ext = `subjectAltName=DNS:${name}\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n`;
    // The extensions go through a file: openssl cannot read /dev/stdin when it is a socket (Node's pipes).
    const extFile = path.join(this.dir, `ext-${randomBytes(6).toString('hex')}`);
    await fsp.writeFile(extFile, ext, { mode: 0o600 });
    let leaf: string;
    try {
      leaf = await openssl([
        'x509',
        '-req',
        '-in',
        path.join(this.dir, 'leaf.csr'),
        '-CA',
        path.join(this.dir, 'ca.pem'),
        '-CAkey',
        path.join(this.dir, 'ca.key'),
        '-set_serial',
        `0x${randomBytes(16).toString('hex')}`,
        '-days',
        String(LEAF_DAYS),
        '-sha256',
        '-extfile',
        extFile,
      ]);
    } finally {
      await fsp.rm(extFile, { force: true });
    }
    const ctx = tls.createSecureContext({ key: this.leafKey, cert: leaf + this.caPem });
    if (this.leaves.size >= MAX_LEAVES) this.leaves.delete(this.leaves.keys().next().value!);
    this.leaves.set(name, { ctx, until: Date.now() + LEAF_DAYS * 86_400_000 });
    return ctx;
  }
}
