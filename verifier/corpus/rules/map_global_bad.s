# a direct load past the global section
#@ type kprobe
#@ intent reject
#@ map bss array 4 16 1
ldmapval %r1, bss, 12
ldxdw %r0, [%r1]
exit
