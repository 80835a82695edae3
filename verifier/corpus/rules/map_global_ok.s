# a direct load of a global variable (single-element array)
#@ type kprobe
#@ intent accept
#@ map bss array 4 16 1
ldmapval %r1, bss, 8
ldxdw %r0, [%r1]
exit
