# a privileged program may read stack bytes it never wrote
#@ type kprobe
#@ intent accept
ldxdw %r0, [%r10-8]
exit
