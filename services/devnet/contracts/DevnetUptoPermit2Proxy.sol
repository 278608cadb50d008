// SPDX-License-Identifier: MIT
// DEVNET STAND-IN. Not for production use.
//
// x402-fleet's own implementation of the x402 upto Permit2 proxy interface (x402UptoPermit2ProxyABI
// and the upto witness type string shipped in @x402/evm), placed by the devnet at
// 0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002 with anvil_setCode. The payer signs a Permit2
// PermitWitnessTransferFrom for a ceiling (permit.permitted.amount) with the witness
// Witness(address to,address facilitator,uint256 validAfter); the facilitator named in the witness,
// and only it, settles any amount up to that ceiling. Permit2 consumes the nonce, so one signature
// settles at most once (the unused rest of the ceiling is simply never transferred).
// No constructor runs at the canonical address: PERMIT2 is a constant and the reentrancy lock
// lives in transient storage (zero = unlocked).
pragma solidity ^0.8.28;

import {ISignatureTransfer, DevnetPermit2612Attempt} from "./DevnetExactPermit2Proxy.sol";

contract DevnetUptoPermit2Proxy is DevnetPermit2612Attempt {
    struct Witness {
        address to;
        address facilitator;
        uint256 validAfter;
    }

    struct EIP2612Permit {
        uint256 value;
        uint256 deadline;
        bytes32 r;
        bytes32 s;
        uint8 v;
    }

    event Settled();
    event SettledWithPermit();

    error AmountExceedsPermitted();
    // Raised by the deployed proxy (from its base contract) though the published upto ABI omits it.
    error InvalidAmount();
    error InvalidDestination();
    error InvalidOwner();
    error InvalidPermit2Address();
    error PaymentTooEarly();
    error Permit2612AmountMismatch();
    error ReentrancyGuardReentrantCall();
    error UnauthorizedFacilitator();

    ISignatureTransfer public constant PERMIT2 = ISignatureTransfer(0x000000000022D473030F116dDEE9F6B43aC78BA3);
    bytes32 public constant WITNESS_TYPEHASH = keccak256("Witness(address to,address facilitator,uint256 validAfter)");
    string public constant WITNESS_TYPE_STRING =
        "Witness witness)TokenPermissions(address token,uint256 amount)Witness(address to,address facilitator,uint256 validAfter)";

    bool private transient _entered;

    modifier nonReentrant() {
        if (_entered) revert ReentrancyGuardReentrantCall();
        _entered = true;
        _;
        _entered = false;
    }

    /// Moves `amount` (at most permit.permitted.amount) from owner to witness.to through Permit2.
    /// Only witness.facilitator may call it.
    function settle(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) external nonReentrant {
        _authorize(permit, amount, witness);
        _validate(amount, owner, witness);
        _transfer(permit, amount, owner, witness, signature);
        emit Settled();
    }

    /// Same as settle, after submitting the owner's EIP-2612 permit granting Permit2 the allowance.
    /// The 2612 permit covers the ceiling (permit.permitted.amount). A failing permit is reported in
    /// an event, not a revert (it may have been front-run); the transfer then decides.
    function settleWithPermit(
        EIP2612Permit calldata permit2612,
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) external nonReentrant {
        _authorize(permit, amount, witness);
        if (permit2612.value != permit.permitted.amount) revert Permit2612AmountMismatch();
        _tryPermit(permit.permitted.token, owner, address(PERMIT2), permit2612.value, permit2612.deadline, permit2612.v, permit2612.r, permit2612.s);
        _validate(amount, owner, witness);
        _transfer(permit, amount, owner, witness, signature);
        emit SettledWithPermit();
    }

    /// The deployed proxy's order: the ceiling and the caller first (before any permit is tried)...
    function _authorize(ISignatureTransfer.PermitTransferFrom calldata permit, uint256 amount, Witness calldata witness) private view {
        if (amount > permit.permitted.amount) revert AmountExceedsPermitted();
        if (msg.sender != witness.facilitator) revert UnauthorizedFacilitator();
    }

    /// ...then a zero amount (a no-op that would consume the Permit2 nonce), the parties, and time.
    function _validate(uint256 amount, address owner, Witness calldata witness) private view {
        if (amount == 0) revert InvalidAmount();
        if (owner == address(0)) revert InvalidOwner();
        if (witness.to == address(0)) revert InvalidDestination();
        if (block.timestamp < witness.validAfter) revert PaymentTooEarly();
    }

    function _transfer(
        ISignatureTransfer.PermitTransferFrom calldata permit,
        uint256 amount,
        address owner,
        Witness calldata witness,
        bytes calldata signature
    ) private {
        if (address(PERMIT2).code.length == 0) revert InvalidPermit2Address();
        PERMIT2.permitWitnessTransferFrom(
            permit,
            ISignatureTransfer.SignatureTransferDetails({to: witness.to, requestedAmount: amount}),
            owner,
            keccak256(abi.encode(WITNESS_TYPEHASH, witness.to, witness.facilitator, witness.validAfter)),
            WITNESS_TYPE_STRING,
            signature
        );
    }
}
