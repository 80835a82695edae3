# pop an 8-byte value into 4 bytes below the frame pointer
#@ type kprobe
#@ intent reject
#@ map q queue 0 8 16
ldmap %r1, q
mov %r2, %r10
add %r2, -4
call 88
mov %r0, 0
exit
