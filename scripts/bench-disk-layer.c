/*
 * The writable layer's cost per sandbox, kernel side only (issue 42, item 5; docs/disk.md "Measured against
 * project quotas"). Two ways to give each sandbox a disk of its own:
 *   image   DIR TEMPLATE  a sparse copy of TEMPLATE (an ext4 image made by mkfs), attached to a loop device
 *                         with LOOP_CONFIGURE and mounted (what sap-sandbox-init -I does), then unmounted and
 *                         removed;
 *   project DIR DEVICE    a directory in one shared filesystem mounted with prjquota at DIR (ext4 with the
 *                         project feature, or XFS), given a project id and a block limit, then removed.
 * Usage (as root): gcc -O2 -o /tmp/disk-layer scripts/bench-disk-layer.c
 *                  /tmp/disk-layer image 50 /var/tmp/d /var/tmp/tmpl.img
 * Prints p50/p90 wall time per create and destroy, and this process's CPU per operation (the kernel's
 * loop workers are not counted).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/loop.h>
#include <linux/quota.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/quota.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec/1e6;}
static double cpu(void){struct rusage r;getrusage(RUSAGE_SELF,&r);return (r.ru_utime.tv_sec+r.ru_stime.tv_sec)*1e3+(r.ru_utime.tv_usec+r.ru_stime.tv_usec)/1e3;}
static int cmpd(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
static void report(const char*what,double*v,int n,double cpums){qsort(v,n,sizeof*v,cmpd);printf("%-28s p50 %7.2f ms  p90 %7.2f ms  cpu/op %6.2f ms\n",what,v[n/2],v[n*9/10],cpums/n);}
int main(int argc,char**argv){
  const char*mode=argv[1]; int n=atoi(argv[2]); const char*dir=argv[3]; const char*tmpl=argc>4?argv[4]:0;
  double *c=calloc(n,sizeof(double)),*d=calloc(n,sizeof(double)); char p[512],m[512];
  double c0=cpu(),cc,cd=0;
  if(!strcmp(mode,"image")){
    // template: a pre-made sparse ext4 image; each create = copy extents (here: FICLONE-less sparse copy by cp is a process, so we reflink-free copy the allocated extents)
    int tf=open(tmpl,O_RDONLY); struct stat st; fstat(tf,&st);
    char*buf=malloc(1<<20);
    for(int i=0;i<n;i++){
      double t0=now();
      snprintf(p,sizeof p,"%s/img-%d",dir,i); snprintf(m,sizeof m,"%s/mnt-%d",dir,i); mkdir(m,0700);
      int f=open(p,O_RDWR|O_CREAT|O_TRUNC,0600); ftruncate(f,st.st_size);
      off_t off=0; for(;;){off_t ds=lseek(tf,off,SEEK_DATA); if(ds<0)break; off_t hs=lseek(tf,ds,SEEK_HOLE); for(off_t o=ds;o<hs;){ssize_t k=pread(tf,buf,(hs-o)>(1<<20)?(1<<20):(hs-o),o); pwrite(f,buf,k,o); o+=k;} off=hs;}
      char dev[64]; int lf;
      for(int tries=0;;tries++){int lc=open("/dev/loop-control",O_RDWR); int ln=ioctl(lc,LOOP_CTL_GET_FREE); close(lc);
      snprintf(dev,sizeof dev,"/dev/loop%d",ln); lf=open(dev,O_RDWR);
      struct loop_config cfg; memset(&cfg,0,sizeof cfg); cfg.fd=f; cfg.info.lo_flags=LO_FLAGS_AUTOCLEAR|LO_FLAGS_DIRECT_IO;
      if(ioctl(lf,LOOP_CONFIGURE,&cfg)==0)break;
      close(lf);
      if(errno!=EBUSY||tries>50){perror("LOOP_CONFIGURE");return 1;}
      }
      if(mount(dev,m,"ext4",MS_NOSUID|MS_NODEV|MS_NOATIME,"noinit_itable,discard,errors=remount-ro")){perror("mount");return 1;}
      close(lf); close(f);
      char q[600]; snprintf(q,sizeof q,"%s/u",m); mkdir(q,0755); snprintf(q,sizeof q,"%s/w",m); mkdir(q,0755);
      c[i]=now()-t0;
    }
    cc=cpu()-c0; report("image: create",c,n,cc);
    for(int i=0;i<n;i++){ // write a few files, like a short sandbox
      snprintf(m,sizeof m,"%s/mnt-%d/u/f",dir,i); int f=open(m,O_WRONLY|O_CREAT,0644); write(f,buf,65536); close(f);}
    c0=cpu();
    for(int i=0;i<n;i++){double t0=now(); snprintf(p,sizeof p,"%s/img-%d",dir,i); snprintf(m,sizeof m,"%s/mnt-%d",dir,i);
      if(umount2(m,0)){perror("umount");} unlink(p); rmdir(m); d[i]=now()-t0;}
    cd=cpu()-c0; report("image: destroy",d,n,cd);
  } else {
    // shared fs with project quotas mounted at dir (prjquota); each create = mkdir u,w + set project + quota limit
    struct statfs sf0; statfs(dir,&sf0);
    char devpath[256]; snprintf(devpath,sizeof devpath,"%s",argv[4]);
    for(int i=0;i<n;i++){
      double t0=now(); int proj=1000+i;
      snprintf(p,sizeof p,"%s/sb-%d",dir,i); mkdir(p,0700);
      int f=open(p,O_RDONLY|O_DIRECTORY); struct fsxattr fx; ioctl(f,FS_IOC_FSGETXATTR,&fx); fx.fsx_projid=proj; fx.fsx_xflags|=FS_XFLAG_PROJINHERIT;
      if(ioctl(f,FS_IOC_FSSETXATTR,&fx)){perror("FSSETXATTR");return 1;} close(f);
      struct if_dqblk q; memset(&q,0,sizeof q); q.dqb_bhardlimit=20480ULL*1024; /* 1K blocks */ q.dqb_valid=QIF_BLIMITS;
      if(quotactl(QCMD(Q_SETQUOTA,PRJQUOTA),devpath,proj,(caddr_t)&q)){perror("quotactl");return 1;}
      char s[600]; snprintf(s,sizeof s,"%s/u",p); mkdir(s,0755); snprintf(s,sizeof s,"%s/w",p); mkdir(s,0755);
      c[i]=now()-t0;
    }
    cc=cpu()-c0; report("project: create",c,n,cc);
    char*buf=calloc(1,65536);
    for(int i=0;i<n;i++){snprintf(m,sizeof m,"%s/sb-%d/u/f",dir,i); int f=open(m,O_WRONLY|O_CREAT,0644); write(f,buf,65536); close(f);}
    c0=cpu();
    for(int i=0;i<n;i++){double t0=now(); int proj=1000+i; char s[600];
      snprintf(s,sizeof s,"%s/sb-%d/u/f",dir,i); unlink(s); snprintf(s,sizeof s,"%s/sb-%d/u",dir,i); rmdir(s); snprintf(s,sizeof s,"%s/sb-%d/w",dir,i); rmdir(s); snprintf(s,sizeof s,"%s/sb-%d",dir,i); rmdir(s);
      struct if_dqblk q; memset(&q,0,sizeof q); q.dqb_valid=QIF_BLIMITS; quotactl(QCMD(Q_SETQUOTA,PRJQUOTA),devpath,proj,(caddr_t)&q);
      d[i]=now()-t0;}
    cd=cpu()-c0; report("project: destroy",d,n,cd);
  }
  return 0;
}
