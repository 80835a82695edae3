# lookup gets a number in r1
#@ type kprobe
#@ intent reject
stw [%r10-4], 0
mov %r1, 1
mov %r2, %r10
add %r2, -4
call 1
mov %r0, 0
exit
