# comparing an initialised register
#@ type kprobe
#@ intent accept
mov %r0, 0
mov %r5, 1
jeq %r5, 1, +1
mov %r0, 1
exit
