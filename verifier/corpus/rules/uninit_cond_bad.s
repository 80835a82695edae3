# comparing an uninitialised register
#@ type kprobe
#@ intent reject
mov %r0, 0
jeq %r5, 1, +1
mov %r0, 1
exit
