# an address outside the global section
#@ type kprobe
#@ intent reject
#@ map bss array 4 16 1
ldmapval %r1, bss, 16
ldxdw %r0, [%r1]
exit
