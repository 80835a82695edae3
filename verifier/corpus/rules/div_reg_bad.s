# division by an uninitialised register
#@ type kprobe
#@ intent reject
ldxdw %r0, [%r1+8]
div %r0, %r2
exit
