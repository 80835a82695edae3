# pop into an 8-byte stack buffer
#@ type kprobe
#@ intent accept
#@ map q queue 0 8 16
ldmap %r1, q
mov %r2, %r10
add %r2, -8
call 88
mov %r0, 0
exit
