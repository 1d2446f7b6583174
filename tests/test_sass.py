"""``paged_mqa_logits.aot.sass``: loops found from backward branches, and the local-memory traffic
inside the loops that issue matrix instructions (what the sm_90 spill check judges)."""

from paged_mqa_logits.aot import sass

LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   STL [R1], R2 ;
        /*0020*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R3 ;
        /*0030*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR8], RZ, !UPT ;
        /*0040*/                   LDL R5, [R1+0x4] ;
        /*0050*/                   FMNMX R24, RZ, R24, !PT ;
        /*0060*/               @P1 BRA 0x20 ;
        /*0070*/                   UTMALDG.3D [UR8], [UR10] ;
        /*0080*/                   LDL R6, [R1+0x8] ;
        /*0090*/               @P2 BRA 0x70 ;
        /*00a0*/                   EXIT ;
"""


def test_parse_and_loops():
    code = sass.parse(LISTING)
    assert [i.address for i in code][:3] == [0x0, 0x10, 0x20]
    assert code[5].opcode == "FMNMX" and code[6].opcode == "BRA"
    assert [[i.address for i in lp] for lp in sass.loops(code)] == [[0x20, 0x30, 0x40, 0x50, 0x60], [0x70, 0x80, 0x90]]
    (mma_loop,) = sass.innermost_loops_with(code, "QGMMA")
    assert [i.address for i in sass.local_memory(mma_loop)] == [0x40]


def test_hot_loop_spills_count_only_the_matrix_loops():
    assert sass.hot_loop_spills(LISTING) == 1  # the producer loop's LDL and the prologue's STL do not count
    assert sass.hot_loop_spills(LISTING.replace("LDL R5, [R1+0x4]", "LDS R5, [R1+0x4]")) == 0
