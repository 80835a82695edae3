# a loop that never changes its state
#@ type kprobe
#@ intent reject
mov %r0, 0
loop:
jeq %r0, 0, loop
exit
