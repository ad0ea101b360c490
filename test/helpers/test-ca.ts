import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

/** A CA for test hosts' TLS certificates (test/helpers/test-ca.ts issues them), in `dir`. */
export function makeTestCa(dir: string): void {
  fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
  execFileSync(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:prime256v1',
      '-nodes',
      '-keyout',
      path.join(dir, 'ca.key'),
      '-out',
      path.join(dir, 'ca.pem'),
      '-days',
      '2',
      '-subj',
      '/CN=sap test CA',
      '-addext',
      'basicConstraints=critical,CA:TRUE',
      '-addext',
      'keyUsage=critical,keyCertSign',
    ],
    { stdio: 'ignore' },
  );
}

/**
 * Certificates of the test CA that the global setup makes (SAP_TEST_CA_DIR) and the test stack's
 * sandbox host trusts for upstream TLS (SANDBOX_SEAL_TRUST_FILE): a leaf for `name`, written to
 * `<dir>/<name>.{pem,key}`. For test hosts only (never a real name).
 */
export function testLeaf(name: string): { cert: string; key: string } {
  const dir = process.env.SAP_TEST_CA_DIR;
  if (!dir) throw new Error('SAP_TEST_CA_DIR is not set (is the global setup running?)');
  const cert = path.join(dir, `${name}.pem`);
  const key = path.join(dir, `${name}.key`);
  if (fs.existsSync(cert)) return { cert, key };
  const csr = path.join(dir, `${name}.csr`);
  const ext = path.join(dir, `${name}.ext`);
  fs.writeFileSync(ext, `subjectAltName=DNS:${name}\nextendedKeyUsage=serverAuth\n`);
  execFileSync(
    'openssl',
    ['req', '-new', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', key, '-out', csr, '-subj', `/CN=${name}`],
    { stdio: 'ignore' },
  );
  execFileSync(
    'openssl',
    [
      'x509',
      '-req',
      '-in',
      csr,
      '-CA',
      path.join(dir, 'ca.pem'),
      '-CAkey',
      path.join(dir, 'ca.key'),
      '-CAcreateserial',
      '-days',
      '1',
      '-extfile',
      ext,
      '-out',
      cert,
    ],
    { stdio: 'ignore' },
  );
  return { cert, key };
}
