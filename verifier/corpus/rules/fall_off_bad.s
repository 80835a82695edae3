# the last instruction is not an exit or a jump
#@ type kprobe
#@ intent reject
mov %r0, 0
exit
mov %r0, 1
