import { api, enc, request } from './api';
import { h, fill, table, bytes, when } from './dom';
import { errorBox, errorText } from './page';

interface Entry {
  name: string;
  path: string;
  isDir: boolean;
  size: number;
  modTime: string;
}

/**
 * A file browser over the files API: list a directory, open a subdirectory, download a file (through
 * a signed URL of one minute, so it streams and the key stays out of it), upload files into the directory.
 */
export function fileBrowser(box: HTMLElement, sandboxId: string, signal: AbortSignal, start = '/workspace'): void {
  const base = `/api/sandboxes/${enc(sandboxId)}/files`;
  const pathInput = h('input', { name: 'path', value: start, 'aria-label': 'Directory' });
  const listing = h('div');
  const upload = h('input', { type: 'file', name: 'upload', multiple: true, 'aria-label': 'Upload files' });
  const uploadOut = h('span', { class: 'upload-status' });
  const show = async (dir: string): Promise<void> => {
    pathInput.value = dir;
    fill(listing, h('p', { class: 'loading' }, 'Loading…'));
    try {
      const entries = await api<Entry[]>(`${base}/list?path=${enc(dir)}`, { signal });
      const parent = dir.replace(/\/[^/]+\/?$/, '') || '/';
      fill(
        listing,
        dir !== '/' ? h('p', null, h('button', { class: 'link', onclick: () => void show(parent) }, '↑ Up')) : null,
        table(
          ['Name', 'Size', 'Modified', ''],
          entries
            .sort((a, b) => Number(b.isDir) - Number(a.isDir) || a.name.localeCompare(b.name))
            .map((e) => [
              e.isDir ? h('button', { class: 'link dir', onclick: () => void show(e.path) }, `${e.name}/`) : h('span', { class: 'file' }, e.name),
              e.isDir ? '' : bytes(e.size),
              when(e.modTime),
              e.isDir ? '' : h('button', { class: 'link download', 'data-path': e.path, onclick: () => void download(e.path) }, 'Download'),
            ]),
          'Empty directory.',
        ),
      );
    } catch (err) {
      if (!signal.aborted)
        fill(
          listing,
          errorBox(err, () => void show(dir)),
        );
    }
  };
  const download = async (path: string): Promise<void> => {
    try {
      const { url } = await api<{ url: string }>(`${base}/download-url`, { method: 'POST', body: { path, expiresIn: 60 }, signal });
      // Same origin: a relative link, whatever host the API put in it.
      const u = new URL(url, location.href);
      const a = h('a', { href: `${u.pathname}${u.search}`, download: path.split('/').pop() ?? 'file', rel: 'noreferrer' });
      document.body.appendChild(a);
      a.click();
      a.remove();
    } catch (err) {
      fill(uploadOut, errorBox(err));
    }
  };
  upload.addEventListener('change', async () => {
    const dir = pathInput.value.replace(/\/+$/, '');
    for (const f of Array.from(upload.files ?? [])) {
      fill(uploadOut, `Uploading ${f.name}…`);
      try {
        await request(`${base}?path=${enc(`${dir}/${f.name}`)}`, { method: 'PUT', raw: f, signal, timeoutMs: 600_000 });
        fill(uploadOut, `Uploaded ${f.name} (${bytes(f.size)}).`);
      } catch (err) {
        fill(uploadOut, h('span', { class: 'error' }, `${f.name}: ${errorText(err)}`));
      }
    }
    upload.value = '';
    await show(dir || '/');
  });
  fill(
    box,
    h(
      'form',
      {
        class: 'filters',
        onsubmit: (e: Event) => {
          e.preventDefault();
          void show(pathInput.value.trim() || '/');
        },
      },
      pathInput,
      h('button', { type: 'submit' }, 'Open'),
      h('label', { class: 'upload' }, 'Upload: ', upload),
      uploadOut,
    ),
    listing,
  );
  void show(start);
}
